"""Episodes replayed from a stored state table (benchmarks/research/risk/risk_draft.py's rows), for any ask-or-answer
game.

A state table holds, for each held-out prompt (a "record") and each depth d = 0 .. rounds - 1 (questions asked so
far), the reward of answering there with the policy's draft and the reward of the question asked from there (its
cost, negative; on the stale-digits game a question whose reply is ``none;`` costs ``idle_ask_cost``, not
``ask_cost``). An episode that answers at depth D returns ``answer[D] + sum(ask[0:D])`` exactly: every state's draft
and reply are fixed, so a rule's episodes follow from the table with no model.

Rows written before these fields existed are the calculator's (3 rounds, ask cost 0.1, a right draft +1, a wrong
one -1: how risk_draft.py played them); ``state_table`` derives their rewards from the stored errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALCULATOR_ROUNDS, CALCULATOR_ASK_COST, RIGHT, WRONG = 3, 0.1, 1.0, -1.0  # how the calculator's first rows were played


@dataclass(frozen=True)
class StateTable:
    """Per-state rewards of one row, record-major.

    Attributes:
        rounds: decision rounds per episode (the last always answers).
        answer_rewards: ``[records, rounds]`` reward of answering with the draft at each depth.
        ask_rewards: ``[records, rounds]`` reward of the question asked from each depth (minus its cost; the last
            depth's is never used).
    """

    rounds: int
    answer_rewards: np.ndarray
    ask_rewards: np.ndarray

    @property
    def records(self) -> int:
        return self.answer_rewards.shape[0]


def state_table(row: dict) -> StateTable:
    """The rewards of a stored row: its own fields, or for an old calculator row (no ``answer_rewards``) the
    calculator's rewards derived from its errors. A row of another game without the fields is refused."""
    if "answer_rewards" in row:
        rounds = int(row["rounds"])
        answer = np.array(row["answer_rewards"], dtype=float).reshape(-1, rounds)
        return StateTable(rounds, answer, np.array(row["ask_rewards"], dtype=float).reshape(-1, rounds))
    if row.get("game", "calculator") != "calculator":
        raise ValueError(f"a {row['game']} row without answer_rewards/ask_rewards: its returns cannot be replayed")
    answer = np.where(np.array(row["errors"]), WRONG, RIGHT).reshape(-1, CALCULATOR_ROUNDS)
    return StateTable(CALCULATOR_ROUNDS, answer, np.full(answer.shape, -CALCULATOR_ASK_COST))


def depth_returns(table: StateTable, records: Sequence[int]) -> np.ndarray:
    """``[R, rounds]``: the return of the episode of each record that asks d times, then answers (column d)."""
    rows = np.asarray(records, dtype=int)
    asked = np.cumsum(table.ask_rewards[rows, :-1], axis=1)  # [R, rounds - 1]: cost of the first d + 1 questions
    return table.answer_rewards[rows] + np.concatenate([np.zeros((len(rows), 1)), asked], axis=1)


def answer_depths(table: StateTable, score: Sequence[float], thresholds: np.ndarray,
                  records: Sequence[int]) -> np.ndarray:
    """``[T, R]``: the depth at which the draft rule at each threshold answers on each record: the first depth whose
    score is at most the threshold (ask while it is above), the last round whatever the score."""
    rows = np.asarray(records, dtype=int)[:, None] * table.rounds + np.arange(table.rounds)  # [R, rounds]
    asks = np.asarray(score, dtype=float)[rows][None, :, : table.rounds - 1] > thresholds[:, None, None]
    return np.where(asks.all(axis=2), table.rounds - 1, np.argmin(asks, axis=2))


def curve(table: StateTable, score: Sequence[float], records: Sequence[int],
          thresholds: Sequence[float] | None = None) -> list[tuple[float, float, float]]:
    """``(threshold, questions per episode, mean return)`` of the draft rule at each threshold; by default never
    asking (inf), every distinct score at a depth before the last in increasing order, and asking at every depth
    before the last (-inf: a rule's curve reaches ``rounds - 1`` questions whatever its scores' ties; without it a
    score with many equal values, as sampled disagreement's 0 where all 8 samples agree, stopped short)."""
    if thresholds is None:
        rows = np.asarray(records, dtype=int)[:, None] * table.rounds + np.arange(table.rounds - 1)
        scores = sorted(set(np.asarray(score, dtype=float)[rows].ravel().tolist()))
        thresholds = [float("inf"), *scores, -float("inf")]
    levels = np.array(thresholds, dtype=float)
    depth = answer_depths(table, score, levels, records)  # [T, R]
    returns = np.take_along_axis(np.broadcast_to(depth_returns(table, records), (len(levels), len(records),
                                                                                  table.rounds)),
                                 depth[..., None], axis=2)[..., 0]  # [T, R]
    return list(zip(levels.tolist(), depth.mean(axis=1).tolist(), returns.mean(axis=1).tolist()))


def episodes(table: StateTable, score: Sequence[float] | None, threshold: float,
             records: Sequence[int]) -> list[tuple[int, float]]:
    """``(questions, return)`` of each record under the draft rule at ``threshold``; ``score`` None: never ask."""
    if score is None:
        depth = np.zeros(len(records), dtype=int)
    else:
        depth = answer_depths(table, score, np.array([threshold]), records)[0]
    returns = depth_returns(table, records)[np.arange(len(records)), depth]
    return list(zip(depth.tolist(), returns.tolist()))


def always_ask(table: StateTable, k: int, records: Sequence[int]) -> tuple[float, float]:
    """(questions per episode, mean return) of asking ``k`` times on every record, then answering."""
    return float(k), float(depth_returns(table, records)[:, k].mean())


def upper(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The best return at each ask rate, sorted by rate (the curve a threshold can reach)."""
    best: dict[float, float] = {}
    for rate, ret in points:
        best[rate] = max(best.get(rate, -float("inf")), ret)
    return sorted(best.items())


def at(points: list[tuple[float, float]], rate: float) -> float:
    """The curve's return at ``rate``, linear between its neighbouring points (nan outside them)."""
    below = [p for p in points if p[0] <= rate]
    above = [p for p in points if p[0] >= rate]
    if not below or not above:
        return float("nan")
    (a0, r0), (a1, r1) = below[-1], above[0]
    return r0 if a1 == a0 else r0 + (r1 - r0) * (rate - a0) / (a1 - a0)


def results_path(game: str) -> Path:
    """Where risk_draft.py stores a game's rows: the calculator's first file keeps its name, each other game its own
    (so no file mixes games)."""
    results = Path(__file__).resolve().parents[2] / "results"
    return results / ("risk_draft.jsonl" if game == "calculator" else f"risk_draft_{game.replace('-', '_')}.jsonl")
