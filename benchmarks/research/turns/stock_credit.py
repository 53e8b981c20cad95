"""Per-turn credit on the stockroom (issue 58): chains crediting every turn with the episode's return, chains
crediting each turn with its reward-to-go, and trees backing the turns' rewards up (Q = r + V), on the shipped
multi-step tool task (configs/tools_stock.yaml), at equal policy tokens.

Protocol (fixed before the evaluation runs):

- the three arms (``stock_run.ARMS``) optimise the same return, the sum of the calls' rewards, with no std in the
  advantage and a baseline that leaves the episode out (rloo) or is its siblings' mean (the tree's pairs); they
  differ only in how credit reaches each turn;
- every run stops at ``--budget`` policy tokens (``benchmarks/research/trees/token_budget.py``);
- rates: each arm starts on ``GRID_START`` on the tuning seed 0 and extends the grid until its best validation
  return sits inside it (``tree_vs_chains.chosen_rate``); the validation prompts choose, the test prompts report;
- five evaluation seeds (1-5), each arm at its own chosen rate; 95 % t intervals over the seeds;
- every run's greedy actions turn by turn on the test prompts, beside the warm start's.

Resumes: finished runs are skipped (rows in ``benchmarks/results/stock_credit.jsonl``). ``--report`` only prints.

    .venv/bin/python benchmarks/research/turns/stock_credit.py            # the grids, the seeds, then the tables
    .venv/bin/python benchmarks/research/turns/stock_credit.py --report
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.research.trees.tree_vs_chains import GRID_START, chosen_rate  # noqa: E402
from benchmarks.research.turns.stock_run import ABLATION_ARMS, ARMS, model_id  # noqa: E402
from benchmarks.result_rows import read_rows  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "stock_credit.jsonl"
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}  # by degrees of freedom
# an ablation arm runs at the rate chosen for the arm it varies (no grid of its own), on the seeds it was run for
RATE_OF = {"tree-turns-late": "tree-turns"}
ACTIONS = ("count", "recount", "look", "submit-solved", "submit-early", "text", "other")


def rows_now(budget: int) -> list[dict]:
    model = model_id()
    kept: dict[tuple, dict] = {}
    for r in read_rows(RESULTS):
        if r["model"] == model and r["budget"] in (budget, 0):
            kept.setdefault((r["arm"], r["seed"], r["lr"], r["budget"]), r)
    return list(kept.values())


def plan(rows: list[dict], args: argparse.Namespace) -> tuple[list[dict], dict[str, float]]:
    """The runs still wanted (grid runs first, then seed by seed) and the rates chosen so far."""
    done = {(r["arm"], r["seed"], r["lr"]) for r in rows}
    wanted = [] if ("warm-start", 0, 0.0) in done else [{"arm": "warm-start", "seed": 0, "lr": 0.0, "budget": 0}]
    chosen: dict[str, float] = {}
    for arm in args.arms:
        grid = {r["lr"]: r["val_return"] for r in rows if r["arm"] == arm and r["seed"] == args.tune_seed}
        missing = [lr for lr in GRID_START if lr not in grid]
        if not missing:
            rate, further = chosen_rate(grid)
            missing = [further] if further else []
            if rate is not None:
                chosen[arm] = rate
        wanted += [{"arm": arm, "seed": args.tune_seed, "lr": lr, "budget": args.budget} for lr in missing]
    for seed in args.seeds:
        wanted += [{"arm": arm, "seed": seed, "lr": chosen[arm], "budget": args.budget} for arm in args.arms
                   if arm in chosen and (arm, seed, chosen[arm]) not in done]
    return wanted, chosen


def schedule(args: argparse.Namespace) -> None:
    """Run what the plan wants, ``--parallel`` at a time (one torch thread each), planning again as runs finish
    (a grid that needs a further rate asks for it once its three are in)."""
    going: dict[tuple, subprocess.Popen] = {}
    while True:
        for key, process in list(going.items()):
            if process.poll() is not None:
                del going[key]
                if process.returncode != 0:
                    print(f"run {key} failed (exit {process.returncode})", flush=True)
        wanted, _ = plan(rows_now(args.budget), args)
        wanted = [w for w in wanted if (w["arm"], w["seed"], w["lr"]) not in going]
        if not wanted and not going:
            return
        while wanted and len(going) < args.parallel:
            run = {**wanted.pop(0), "results": str(RESULTS), "threads": args.threads}
            print(f"{time.strftime('%H:%M:%S')} start {run['arm']} seed {run['seed']} lr {run['lr']}", flush=True)
            going[(run["arm"], run["seed"], run["lr"])] = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("stock_run.py")), json.dumps(run)], cwd=ROOT)
        time.sleep(5)


def interval(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    half = T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def tokens_to_reach(row: dict, target: float) -> float | None:
    """Policy tokens spent up to the first epoch whose sampled mean return reached ``target`` (None: never)."""
    spent = 0.0
    for value, tokens in zip(row["curve"], row["tokens"]):
        spent += tokens
        if value >= target:
            return spent
    return None


def report(args: argparse.Namespace) -> None:
    rows = rows_now(args.budget)
    _, chosen = plan(rows, args)
    chosen.update({arm: chosen[source] for arm, source in RATE_OF.items() if source in chosen})
    shown = [*args.arms, *(arm for arm in ABLATION_ARMS if any(r["arm"] == arm for r in rows))]
    warm = next((r for r in rows if r["arm"] == "warm-start"), None)
    print(f"## Rate grids (tuning seed {args.tune_seed}, validation prompts: greedy return)\n")
    rates = sorted({r["lr"] for r in rows if r["seed"] == args.tune_seed and r["arm"] != "warm-start"})
    print("| arm | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | chosen |")
    print("|---|" + "---|" * (len(rates) + 1))
    for arm in args.arms:
        grid = {r["lr"]: r["val_return"] for r in rows if r["arm"] == arm and r["seed"] == args.tune_seed}
        cells = [f"{grid[lr]:.3f}" if lr in grid else "" for lr in rates]
        print(f"| {arm} | " + " | ".join(cells) + f" | {chosen.get(arm, 'grid not done')} |")
    print(f"\n## Test prompts, seeds {args.seeds} at each arm's rate ({args.budget} policy tokens a run; mean "
          "[95 % t interval])\n")
    print(f"| arm | runs | return | solved | tokens to a training return of {args.target} (runs that got there) | "
          "policy tokens | seconds |")
    print("|---|---|---|---|---|---|---|")
    if warm:
        print(f"| warm start | - | {warm['test_return']:.3f} | {warm['test_solved']:.3f} | - | - | - |")
    for arm in shown:
        runs = [r for r in rows if r["arm"] == arm and r["seed"] in args.seeds and r["lr"] == chosen.get(arm)]
        if not runs:
            continue
        reached = [t for t in (tokens_to_reach(r, args.target) for r in runs) if t is not None]
        print(f"| {arm} | {len(runs)} | {interval([r['test_return'] for r in runs])} | "
              f"{interval([r['test_solved'] for r in runs])} | "
              f"{statistics.fmean(reached) if reached else float('nan'):.0f} ({len(reached)} of {len(runs)}) | "
              f"{statistics.fmean(r['policy_tokens'] for r in runs):.0f} | "
              f"{statistics.fmean(r['seconds'] for r in runs):.0f} |")
    print("\n## Greedy actions turn by turn (test prompts; share of episodes, mean over the seeds)\n")
    print("| arm | turn | " + " | ".join(ACTIONS) + " |")
    print("|---|---|" + "---|" * len(ACTIONS))
    for arm in ["warm-start", *shown]:
        runs = [warm] if arm == "warm-start" and warm else [
            r for r in rows if r["arm"] == arm and r["seed"] in args.seeds and r["lr"] == chosen.get(arm)]
        for turn in range(1, 7) if runs else ():
            shares = [statistics.fmean(r["test_actions"].get(f"turn{turn}/{a}", 0.0) for r in runs) for a in ACTIONS]
            if runs and any(shares):
                print(f"| {arm} | {turn} | " + " | ".join(f"{s:.2f}" for s in shares) + " |")
    print("\n## Training rows per turn: share of a run's rows / share of them with advantage exactly 0\n")
    print("| arm | " + " | ".join(f"turn {d}" for d in range(1, 7)) + " |")
    print("|---|" + "---|" * 6)
    for arm in shown:
        runs = [r for r in rows if r["arm"] == arm and r["seed"] in args.seeds and r["lr"] == chosen.get(arm)]
        if runs:
            cells = []
            for d in range(1, 7):
                pairs = [r["turn_credit"].get(f"turn{d}") for r in runs if r["turn_credit"].get(f"turn{d}")]
                cells.append(f"{statistics.fmean(p[0] for p in pairs):.2f} / {statistics.fmean(p[1] for p in pairs):.2f}"
                             if pairs else "-")
            print(f"| {arm} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--tune-seed", type=int, default=0)
    parser.add_argument("--budget", type=int, default=48000, help="policy tokens a run")
    parser.add_argument("--target", type=float, default=1.0, help="the training return whose cost is reported")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if not args.report:
        schedule(args)
    report(args)


if __name__ == "__main__":
    main()
