"""The draft rule's whole return-against-ask-rate curve against the baselines that need no head (issue 41, item 4).

Reads the state tables benchmarks/research/risk/risk_draft.py stored (one file a game, ``risk_episodes.results_path``:
every held-out prompt after 0 .. rounds - 1 questions, the reward of answering there with the greedy draft, the cost of
the question asked from there, and every score at every state), so it runs no model. Compared, per game:

- the draft rule on each score (ask while the score is above a threshold, the last round answers): the draft head,
  the draft's log-prob, the pre-answer probe, and the other stored scores;
- "always ask k times" for k = 0 .. rounds - 1 (the calculator: 3 rounds; the decision-hard stale-digits game: 4),
  and the mixtures of k and k + 1 (asking k + 1 times on a random share of prompts), which draw the straight lines
  between them: a rule with no signal at all.

Per seed the held-out prompts are split in halves, ``--splits`` times at random: the threshold with the best
return on one half (the "best point") is played on the other, and each curve's mean return over the ask rates
between the oracle's and the policy's (either may be the larger; its area over that range divided by its width) is
measured on the other half too. Reported: mean ± 95% t-interval over seeds x splits (the splits of one seed are not
independent, so the interval is narrow; the seeds' own spread is shown apart), and the smallest gap between the
draft head's curve and each baseline's, and the best baseline's at each rate, over that range on the whole
held-out set.

    .venv/bin/python benchmarks/research/risk/risk_curves.py [--games calculator stale-digits] [--splits 200]
    .venv/bin/python benchmarks/research/risk/risk_curves.py --games calculator stale-digits --build   # item 4's whole table

``--build`` first runs risk_draft.py for every game (it skips the seeds already stored; it needs the model and the
2 cores), then reports.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.research.risk.risk_episodes import (  # noqa: E402
    StateTable, always_ask, at, curve, episodes, results_path, state_table, upper)
from benchmarks.research.trees.tree_vs_chains_report import interval  # noqa: E402
from benchmarks.result_rows import read_rows  # noqa: E402

SCORES = {"draft head": "head", "draft log-prob": "seq_logprob", "probe (pre-answer state)": "probe",
          "sampled disagreement": "agreement_8", "smallest token probability": "min_token_prob",
          "first-token entropy": "first_token_entropy", "first-token probability": "first_token_prob",
          "information-hidden flag": "info_hidden"}
READS_THE_RECORD = {"information-hidden flag"}  # knows what is still hidden: no signal a policy has
GAMES = ("calculator", "stale-digits", "hidden-operands")


def mean_over(points: list[tuple[float, float]], low: float, high: float, steps: int = 50) -> float:
    """The curve's mean return over ask rates ``low``..``high`` (its area there over the width)."""
    return statistics.fmean(at(points, low + (high - low) * i / steps) for i in range(steps + 1))


def fixed_curve(table: StateTable, records: list[int]) -> list[tuple[float, float]]:
    """Always ask k, k = 0 .. rounds - 1, on ``records``: ``(k, mean return)`` (``at`` draws their mixtures)."""
    return upper([always_ask(table, k, records) for k in range(table.rounds)])


def one_split(row: dict, table: StateTable, rng: random.Random, low: float,
              high: float) -> dict[str, dict[str, float]]:
    """Choose on one random half of the records, measure on the other: each rule's best point and mean return."""
    records = list(range(table.records))
    rng.shuffle(records)
    choose, measure = records[: len(records) // 2], records[len(records) // 2:]
    out = {}
    for name, key in SCORES.items():
        score = row["scores"][key]
        threshold = max(curve(table, score, choose), key=lambda c: c[2])[0]
        played = episodes(table, score, threshold, measure)
        points = upper([(c[1], c[2]) for c in curve(table, score, measure)])
        out[name] = {"best point": statistics.fmean(r for _, r in played), "mean return": mean_over(points, low, high)}
    chosen = fixed_curve(table, choose)
    k = max(range(table.rounds), key=lambda k: chosen[k][1])
    fixed = fixed_curve(table, measure)
    out["always ask k"] = {"best point": fixed[k][1], "mean return": mean_over(fixed, low, high)}
    return out


def smallest_gap(head: list[tuple[float, float]], rival: list[tuple[float, float]], rates: list[float]) -> str:
    """The smallest ``head - rival`` over the ``rates`` where both curves are defined, and where that is."""
    gaps = [(at(head, a) - at(rival, a), a) for a in rates]
    defined = [(g, a) for g, a in gaps if not math.isnan(g)]
    if not defined:
        return "nan (no common ask rate)"
    text = f"{min(defined)[0]:+.3f}"
    if len(defined) < len(gaps):
        text += f" (over {min(a for _, a in defined):.2f}-{max(a for _, a in defined):.2f} only)"
    return text


def gap_lines(rows: list[dict], tables: list[StateTable], low: float, high: float) -> None:
    rates = [low + (high - low) * i / 50 for i in range(51)]
    for row, table in zip(rows, tables):
        records = list(range(table.records))
        head = upper([(c[1], c[2]) for c in curve(table, row["scores"]["head"], records)])
        rivals = {name: upper([(c[1], c[2]) for c in curve(table, row["scores"][key], records)])
                  for name, key in SCORES.items() if key != "head"}
        rivals["always ask k"] = fixed_curve(table, records)
        fair = [points for name, points in rivals.items() if name not in READS_THE_RECORD]
        best = [(a, max((at(p, a) for p in fair if not math.isnan(at(p, a))), default=float("nan"))) for a in rates]
        print(f"seed {row['seed']}, whole held-out set: smallest gap of the head's curve over "
              + ", ".join(f"{name} {smallest_gap(head, points, rates)}" for name, points in rivals.items())
              + f"; over the best baseline at each rate (the flag left out) {smallest_gap(head, best, rates)}")


def report(game: str, rows: list[dict], splits: int) -> None:
    """Item 4's table of one game from its stored rows."""
    tables = [state_table(r) for r in rows]
    oracle = statistics.fmean(r["targets"]["oracle"] for r in rows)
    policy = statistics.fmean(r["targets"]["policy"] for r in rows)
    low, high = min(oracle, policy), max(oracle, policy)
    print(f"\n## {game}: {len(rows)} seeds, {tables[0].records} held-out prompts x {tables[0].rounds} depths; ask "
          f"rates from the oracle's {oracle:.2f} to the policy's {policy:.2f} questions per episode; policy alone "
          f"{statistics.fmean(r['rules']['policy alone']['return'] for r in rows):.3f}"
          + (f"; oracle {rows[0]['oracle']['return']:.3f}" if "oracle" in rows[0] else ""))
    records = list(range(tables[0].records))
    print("\nalways ask k, whole held-out set: " + ", ".join(
        f"k={k}: {always_ask(tables[0], k, records)[1]:.3f}" for k in range(tables[0].rounds)))
    results: dict[str, dict[str, list[float]]] = {}
    per_seed: dict[str, list[float]] = {}
    for row, table in zip(rows, tables):
        rng = random.Random(row["seed"])
        seed_values: dict[str, list[float]] = {}
        for _ in range(splits):
            for name, figures in one_split(row, table, rng, low, high).items():
                for key, value in figures.items():
                    results.setdefault(name, {}).setdefault(key, []).append(value)
                seed_values.setdefault(name, []).append(figures["mean return"])
        for name, values in seed_values.items():
            per_seed.setdefault(name, []).append(statistics.fmean(values))
    print(f"\n| rule (chosen on one half, measured on the other; {len(rows)} seeds x {splits} splits) | best point "
          f"| mean return over ask rates {low:.2f}-{high:.2f} | per seed |\n|---|---|---|---|")
    for name, figures in results.items():
        cells = [f"{m:.3f} ± {h:.3f}" if not any(math.isnan(v) for v in figures[k]) else "does not reach the range"
                 for k, (m, h) in ((k, interval([0.0 if math.isnan(v) else v for v in figures[k]]))
                                   for k in ("best point", "mean return"))]
        print(f"| {name} | " + " | ".join(cells) + " | " + ", ".join(f"{v:.3f}" for v in per_seed[name]) + " |")
    gap_lines(rows, tables, low, high)


def stored_rows(path: Path, game: str) -> list[dict]:
    """The rows of ``game`` in ``path``; refused when they mix setups (training prompts, held-out prompts)."""
    rows = [r for r in read_rows(path) if r.get("game", "calculator") == game]
    setups = {(r["train_prompts"], len(r["errors"])) for r in rows}
    if len(setups) > 1:
        raise SystemExit(f"{path}: rows of different setups (training prompts, states): {sorted(setups)}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", "--game", nargs="+", choices=GAMES, default=["calculator"])
    parser.add_argument("--results", type=Path, default=None, help="one game's rows (default: the game's file)")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--build", action="store_true", help="run risk_draft.py first (it skips stored seeds)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --build")
    parser.add_argument("--train-prompts", type=int, default=600, help="with --build")
    args = parser.parse_args()
    if args.results is not None and len(args.games) > 1:
        parser.error("--results names one game's rows: give one game")
    for game in args.games:
        path = args.results or results_path(game)
        if args.build:
            sys.stdout.flush()  # this game's lines after the last game's report, also into a file
            subprocess.run([sys.executable, str(Path(__file__).with_name("risk_draft.py")), "--game", game, "--results",
                            str(path), "--train-prompts", str(args.train_prompts), "--seeds",
                            *map(str, args.seeds)], check=True)
        print(f"\n{path.name}", end="")
        report(game, stored_rows(path, game), args.splits)


if __name__ == "__main__":
    main()
