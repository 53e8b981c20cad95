"""The draft rule's whole return-against-ask-rate curve against the baselines that need no head (issue 41, item 4).

Reads the state tables benchmarks/risk_draft.py stored (``benchmarks/results/risk_draft.jsonl``: every held-out
prompt after 0, 1 and 2 questions, whether the greedy draft there is wrong, and every score at every state), so it
runs no model. Compared, on the calculator (the game those rows are of):

- the draft rule on each score (ask while the score is above a threshold, the last round answers): the draft head,
  the draft's log-prob, and the other stored scores;
- "always ask k times" for k = 0, 1, 2 (3 rounds: the third always answers), and the mixtures of k and k + 1
  (asking k + 1 times on a random share of prompts), which draw the straight lines between them: a rule with no
  signal at all.

Per seed the 300 held-out prompts are split in halves, ``--splits`` times at random: the threshold with the best
return on one half (the "best point") is played on the other, and each curve's mean return over the ask rates
between the oracle's and the policy's (its area over that range divided by its width) is measured on the other
half too. Reported: mean ± 95% t-interval over seeds x splits (the splits of one seed are not independent, so the
interval is narrow; the seeds' own spread is shown apart), and the smallest gap between the draft head's curve and
the best of the baselines' over that range on the whole held-out set.

    .venv/bin/python benchmarks/risk_curves.py [--results benchmarks/results/risk_draft.jsonl] [--splits 200]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from tree_vs_chains_report import interval  # noqa: E402

ASK_COST, RIGHT, WRONG, ROUNDS = 0.1, 1.0, -1.0, 3  # CalculatorTask's defaults, as risk_draft.py played them
SCORES = {"draft head": "head", "draft log-prob": "seq_logprob", "probe (pre-answer state)": "probe",
          "sampled disagreement": "agreement_8"}


def episodes(errors: list[bool], score: list[float] | None, threshold: float, records: list[int]) -> list[tuple[int, float]]:
    """``(questions, return)`` of each record in ``records`` under the draft rule at ``threshold`` (states are
    record-major, ``ROUNDS`` a record); ``score`` None: never ask."""
    out = []
    for record in records:
        for depth in range(ROUNDS):
            row = record * ROUNDS + depth
            if depth < ROUNDS - 1 and score is not None and score[row] > threshold:
                continue
            out.append((depth, (WRONG if errors[row] else RIGHT) - ASK_COST * depth))
            break
    return out


def always_ask(errors: list[bool], k: int, records: list[int]) -> tuple[float, float]:
    """(questions per episode, mean return) of asking ``k`` times on every record, then answering."""
    return float(k), statistics.fmean((WRONG if errors[r * ROUNDS + k] else RIGHT) - ASK_COST * k for r in records)


def curve(errors: list[bool], score: list[float], records: list[int]) -> list[tuple[float, float, float]]:
    """``(threshold, questions per episode, mean return)`` at every distinct threshold (and never asking), as
    ``episodes`` plays them, for all thresholds at once (arrays ``[thresholds, records]``)."""
    rows = np.array(records)[:, None] * ROUNDS + np.arange(ROUNDS)  # [R, ROUNDS]
    s, answer = np.array(score)[rows], np.where(np.array(errors)[rows], WRONG, RIGHT)  # [R, ROUNDS] each
    thresholds = np.array([float("inf"), *sorted(set(s[:, : ROUNDS - 1].ravel().tolist()))])
    asks = s[None, :, : ROUNDS - 1] > thresholds[:, None, None]  # [T, R, ROUNDS - 1]: asks at that depth
    depth = np.where(asks.all(axis=2), ROUNDS - 1, np.argmin(asks, axis=2))  # the first depth that answers
    returns = np.take_along_axis(np.broadcast_to(answer, (len(thresholds), *answer.shape)), depth[..., None],
                                 axis=2)[..., 0] - ASK_COST * depth
    return list(zip(thresholds.tolist(), depth.mean(axis=1).tolist(), returns.mean(axis=1).tolist()))


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


def mean_over(points: list[tuple[float, float]], low: float, high: float, steps: int = 50) -> float:
    """The curve's mean return over ask rates ``low``..``high`` (its area there over the width)."""
    return statistics.fmean(at(points, low + (high - low) * i / steps) for i in range(steps + 1))


def one_split(row: dict, rng: random.Random, low: float, high: float) -> dict[str, dict[str, float]]:
    """Choose on one random half of the records, measure on the other: each rule's best point and mean return."""
    records = list(range(len(row["errors"]) // ROUNDS))
    rng.shuffle(records)
    choose, measure = records[: len(records) // 2], records[len(records) // 2:]
    errors, out = row["errors"], {}
    for name, key in SCORES.items():
        score = row["scores"][key]
        threshold = max(curve(errors, score, choose), key=lambda c: c[2])[0]
        played = episodes(errors, score, threshold, measure)
        points = upper([(c[1], c[2]) for c in curve(errors, score, measure)])
        out[name] = {"best point": statistics.fmean(r for _, r in played), "mean return": mean_over(points, low, high)}
    asks = upper([always_ask(errors, k, choose) for k in range(ROUNDS)])
    k = max(range(ROUNDS), key=lambda k: asks[k][1])
    fixed = upper([always_ask(errors, k, measure) for k in range(ROUNDS)])
    out["always ask k"] = {"best point": fixed[k][1], "mean return": mean_over(fixed, low, high)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "risk_draft.jsonl")
    parser.add_argument("--splits", type=int, default=200)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    low = statistics.fmean(r["targets"]["oracle"] for r in rows)
    high = statistics.fmean(r["targets"]["policy"] for r in rows)
    print(f"{len(rows)} seeds of {args.results.name}; ask rates from the oracle's {low:.2f} to the policy's "
          f"{high:.2f} questions per episode; policy alone "
          f"{statistics.fmean(r['rules']['policy alone']['return'] for r in rows):.3f}")
    records = list(range(len(rows[0]["errors"]) // ROUNDS))
    print("\nalways ask k, whole held-out set: " + ", ".join(
        f"k={k}: {always_ask(rows[0]['errors'], k, records)[1]:.3f}" for k in range(ROUNDS)))
    results: dict[str, dict[str, list[float]]] = {}
    per_seed: dict[str, list[float]] = {}
    for row in rows:
        rng = random.Random(row["seed"])
        seed_values: dict[str, list[float]] = {}
        for _ in range(args.splits):
            for name, figures in one_split(row, rng, low, high).items():
                for key, value in figures.items():
                    results.setdefault(name, {}).setdefault(key, []).append(value)
                seed_values.setdefault(name, []).append(figures["mean return"])
        for name, values in seed_values.items():
            per_seed.setdefault(name, []).append(statistics.fmean(values))
    print(f"\n| rule (chosen on one half, measured on the other; {len(rows)} seeds x {args.splits} splits) | best point "
          f"| mean return over ask rates {low:.2f}-{high:.2f} | per seed |\n|---|---|---|---|")
    for name, figures in results.items():
        cells = [f"{m:.3f} ± {h:.3f}" if not any(math.isnan(v) for v in figures[k]) else "does not reach the range"
                 for k, (m, h) in ((k, interval([0.0 if math.isnan(v) else v for v in figures[k]]))
                                   for k in ("best point", "mean return"))]
        print(f"| {name} | " + " | ".join(cells) + " | " + ", ".join(f"{v:.3f}" for v in per_seed[name]) + " |")
    for row in rows:
        errors = row["errors"]
        head = upper([(c[1], c[2]) for c in curve(errors, row["scores"]["head"], records)])
        rivals = {name: upper([(c[1], c[2]) for c in curve(errors, row["scores"][key], records)])
                  for name, key in SCORES.items() if key != "head"}
        rivals["always ask k"] = upper([always_ask(errors, k, records) for k in range(ROUNDS)])
        rates = [low + (high - low) * i / 50 for i in range(51)]
        gaps = {name: min(at(head, a) - at(points, a) for a in rates) for name, points in rivals.items()}
        print(f"seed {row['seed']}, whole held-out set: smallest gap of the head's curve over "
              + ", ".join(f"{name} {gap:+.3f}" for name, gap in gaps.items()) + " (nan: that curve does not reach "
              "every ask rate of the range)")


if __name__ == "__main__":
    main()
