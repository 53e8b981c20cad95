"""The multi-round games of issue 20: rules, split and oracle by hand."""

from __future__ import annotations

import pytest

from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask


def test_each_question_reveals_the_next_hidden_operand_and_an_answer_is_scored():
    task = HiddenOperandsTask()
    record = HiddenOperandsTask.record(47, 8, ["a", "b"])
    assert record["prompt"] == "?+?=" and record["answer"] == "55"
    first, second, third = (task.step(record, r, " ?") for r in (1, 2, 3))
    assert (first.kind, first.reward, first.terminal) == ("ask", -0.1, False)
    assert first.reply == "a=47;" and second.reply == "b=8;" and third.reply == "none;"  # nothing left to reveal: the question only costs
    right, wrong, garbled = task.step(record, 3, "55"), task.step(record, 1, "54"), task.step(record, 1, "5?")
    assert (right.kind, right.reward, right.terminal, right.correct) == ("answer", 1.0, True, True)
    assert (wrong.reward, wrong.correct) == (-1.0, False)
    assert (garbled.kind, garbled.reward, garbled.terminal) == ("malformed", -1.0, True)
    only_b = HiddenOperandsTask.record(12, 90, ["b"])
    assert only_b["prompt"] == "12+?=" and task.step(only_b, 1, "?").reply == "b=90;"
    assert task.step(only_b, 2, "?").reply == "none;"


def test_split_is_disjoint_hides_each_operand_about_half_the_time_and_the_oracle_pays_per_question():
    task = HiddenOperandsTask(heldout_size=500)
    train, validation, test = task.split()
    heldout = validation + test
    assert len(train) + len(heldout) == 8100 and len(validation) == len(test) == 250
    pairs = lambda records: {(r["a"], r["b"]) for r in records}  # noqa: E731
    assert not pairs(train) & pairs(heldout) and not pairs(validation) & pairs(test)
    counts = [sum(len(r["hidden"]) == k for r in train) / len(train) for k in (0, 1, 2)]
    assert counts == pytest.approx([0.25, 0.5, 0.25], abs=0.02)
    records = [HiddenOperandsTask.record(10, 12, hidden) for hidden in ([], ["a"], ["a", "b"], ["b"])]
    assert task.oracle_return(records) == pytest.approx((1.0 + 0.9 + 0.8 + 0.9) / 4, abs=1e-12)
    assert task.failure_reward == -1.0


def test_rewards_that_make_asking_pointless_are_refused():
    with pytest.raises(ValueError, match="wrong_reward < -ask_cost < correct_reward"):
        HiddenOperandsTask(ask_cost=1.5)


def test_calculator_replaces_the_first_two_operands_by_their_sum_and_the_oracle_calls_until_two_remain():
    task = CalculatorTask()
    record = CalculatorTask.record([12, 25, 17, 30])
    assert record["prompt"] == "12+25+17+30=" and record["answer"] == "84"
    replies = [task.step(record, r, "?").reply for r in (1, 2, 3, 4)]
    assert replies == ["37+17+30=", "54+30=", "84=", "84="]  # a single number stays as it is
    assert task.step(record, 1, "?").reward == -0.1
    assert (task.step(record, 3, "84").reward, task.step(record, 3, "83").reward) == (1.0, -1.0)
    two, three = CalculatorTask.record([10, 11]), CalculatorTask.record([10, 11, 12])
    assert [CalculatorTask.oracle_questions(r) for r in (two, three, record)] == [0, 1, 2]
    assert task.oracle_return([two, three, record]) == pytest.approx((1.0 + 0.9 + 0.8) / 3, abs=1e-12)


def test_calculator_split_is_disjoint_with_an_equal_share_of_each_operand_count():
    train, validation, test = CalculatorTask().split()
    heldout = validation + test
    assert len(train) == 900 and len(validation) == len(test) == 150
    operands = lambda records: {tuple(r["operands"]) for r in records}  # noqa: E731
    assert not operands(train) & operands(heldout) and not operands(validation) & operands(test)
    assert [sum(len(r["operands"]) == k for r in train + heldout) for k in (2, 3, 4)] == [400, 400, 400]
    assert all(10 <= x <= 30 for r in heldout for x in r["operands"])
    with pytest.raises(ValueError, match="operand_counts"):
        CalculatorTask(operand_counts=(5,))
