"""Episodes replayed from a state table (benchmarks/research/risk/risk_episodes.py, risk_curves.py), worked out by hand
on a table of 2 prompts x 4 depths with stale-digits costs: a question revealing a stale digit costs 0.1, one
answered ``none;`` (nothing stale left) costs 0.5."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for benchmarks.*

from benchmarks.research.risk.risk_curves import fixed_curve  # noqa: E402
from benchmarks.research.risk.risk_episodes import (  # noqa: E402
    StateTable, always_ask, at, curve, depth_returns, episodes, state_table)

from lit_grpo.tasks.games.stale_digits import StaleDigitsTask  # noqa: E402

EXACT = 1e-12  # float rounding only
# record 0: one stale digit; the draft is wrong before the first question, right after it
# record 1: two stale digits; the draft is right after two questions only (wrong again at depth 3)
ROW = {"game": "stale-digits", "rounds": 4,
       "answer_rewards": [-1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0],
       "ask_rewards": [-0.1, -0.5, -0.5, -0.5, -0.1, -0.1, -0.5, -0.5]}
SCORE = [0.9, 0.2, 0.7, 0.9, 0.8, 0.6, 0.3, 0.1]  # record-major: record 0 depths 0-3, then record 1
# answering after d questions: record 0: -1, 1 - 0.1 = 0.9, 0.9 - 0.5 = 0.4, 0.4 - 0.5 = -0.1
#                              record 1: -1, -1 - 0.1 = -1.1, 1 - 0.2 = 0.8, -1 - 0.2 - 0.5 = -1.7
RETURNS = [[-1.0, 0.9, 0.4, -0.1], [-1.0, -1.1, 0.8, -1.7]]


def table() -> StateTable:
    return state_table(ROW)


def test_the_stale_digits_task_charges_what_the_table_says():
    task = StaleDigitsTask()
    record = task.record([1, 2, 3], [1, 5, 3], "B")  # b is stale
    assert [task.step(record, r, "?").reward for r in (1, 2, 3)] == [-0.1, -0.5, -0.5]
    assert task.step(record, 2, "123").reward == 1.0 and task.step(record, 1, "153").reward == -1.0


def test_the_return_of_answering_after_each_number_of_questions():
    assert depth_returns(table(), [0, 1]) == pytest.approx(np.array(RETURNS), abs=EXACT)


def test_always_ask_k_by_hand():
    means = [always_ask(table(), k, [0, 1]) for k in range(4)]  # (-1 - 1) / 2, (0.9 - 1.1) / 2, ...
    assert np.array(means) == pytest.approx(np.array([[0, -1.0], [1, -0.1], [2, 0.6], [3, -0.9]]), abs=EXACT)
    assert at(fixed_curve(table(), [0, 1]), 1.5) == pytest.approx(0.25, abs=EXACT)  # half k = 1, half k = 2


def test_the_draft_rule_asks_while_the_score_is_above_the_threshold():
    # threshold 0.3: record 0 asks at 0.9, answers at 0.2 (depth 1: 0.9); record 1 asks at 0.8 and 0.6 and answers
    # at 0.3, equal to the threshold (depth 2: 0.8)
    assert np.array(episodes(table(), SCORE, 0.3, [0, 1])) == pytest.approx(np.array([[1, 0.9], [2, 0.8]]),
                                                                              abs=EXACT)
    # threshold 0.1: both ask until the last round, which answers whatever its score (0.9 on record 0): two idle
    # questions on record 0
    assert np.array(episodes(table(), SCORE, 0.1, [0, 1])) == pytest.approx(np.array([[3, -0.1], [3, -1.7]]),
                                                                              abs=EXACT)
    assert episodes(table(), None, 0.1, [1]) == [(0, -1.0)]


def test_the_curve_runs_from_never_asking_to_asking_every_round():
    points = curve(table(), SCORE, [0, 1])
    assert [p[0] for p in points] == [float("inf"), 0.2, 0.3, 0.6, 0.7, 0.8, 0.9, -float("inf")]
    # 0.6: record 0 answers at depth 1 (0.9), record 1 at depth 1 too, its score 0.6 not above (-1.1)
    expected = {float("inf"): (0.0, -1.0), 0.3: (1.5, 0.85), 0.6: (1.0, -0.1), -float("inf"): (3.0, -0.9)}
    for threshold, ask_rate, mean in points:
        if threshold in expected:
            assert (ask_rate, mean) == pytest.approx(expected[threshold], abs=EXACT)


def test_old_calculator_rows_are_read_with_the_calculator_rewards():
    old = state_table({"errors": [True, False, False, False, True, True]})  # 2 records x 3 depths, no reward fields
    assert old.rounds == 3
    assert depth_returns(old, [0, 1]) == pytest.approx(np.array([[-1.0, 0.9, 0.8], [1.0, -1.1, -1.2]]), abs=EXACT)
    with pytest.raises(ValueError):
        state_table({"game": "stale-digits", "errors": [True] * 8})
