"""The clarification game's environment: asking, answering, malformed segments, splits."""

import pytest

from lit_grpo.tasks import ClarifyTask, EnvStep


def test_ask_then_answer_and_rewards():
    task = ClarifyTask()
    hidden = ClarifyTask.record(37, 25, hidden=True)
    assert hidden["prompt"] == "37+?=" and hidden["answer"] == "62"
    assert task.step(hidden, 1, "?") == EnvStep("ask", -0.1, terminal=False, reply="b=25;")
    assert task.step(hidden, 2, " 62 ") == EnvStep("answer", 1.0, terminal=True, correct=True)
    assert task.step(hidden, 1, "61") == EnvStep("answer", -1.0, terminal=True, correct=False)
    assert task.step(hidden, 1, "6?2") == EnvStep("malformed", -1.0, terminal=True)
    assert task.step(hidden, 1, "") == EnvStep("malformed", -1.0, terminal=True)
    shown = ClarifyTask.record(37, 25, hidden=False)
    assert shown["prompt"] == "37+25="
    # single-round view: the first segment's reward; the failure reward is the lowest reward the game gives
    assert task.reward(shown, "62", []) == 1.0 and task.reward(shown, "?", []) == pytest.approx(-0.1)
    assert task.failure_reward == -1.0 and task.no_answer_reward == -0.5 and task.malformed_reward == -1.0


def test_splits_disjoint_and_about_half_hidden():
    task = ClarifyTask(heldout_size=1000)
    train, heldout = task.train_records(), task.heldout_records()
    assert len(heldout) == 1000 and len(train) == 8100 - 1000
    assert not {(r["a"], r["b"]) for r in train} & {(r["a"], r["b"]) for r in heldout}
    share = sum(r["hidden"] for r in heldout) / len(heldout)
    assert 0.45 < share < 0.55
    assert ClarifyTask().heldout_records()[:5] == heldout[:5]  # deterministic


def test_asking_must_be_able_to_pay_and_to_cost():
    with pytest.raises(ValueError, match="asking"):
        ClarifyTask(ask_cost=2.0)
    with pytest.raises(ValueError, match="hidden_fraction"):
        ClarifyTask(hidden_fraction=1.5)
