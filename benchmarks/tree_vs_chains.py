"""Tree rollouts against chains on a multi-round game, at an equal budget of generated segments, over seeds.

Each run trains through the ``lit-grpo`` command from the game's warm-start model until ``--budget`` policy segments
(every round's completion counted, ``data.completion_budget``) are spent, then plays the 500 held-out prompts greedily
(up to 3 rounds) with the saved adapter: mean return, accuracy, questions per episode. Each finished run is appended
to ``--results`` (JSON lines) and skipped when found there, so the table can be built over several sittings or
extended with ``--seeds``. ``--report`` prints the table (mean and 95% t-interval over seeds, the share of the
warm-start-to-oracle gap closed) and draws each game's learning curves (training return per epoch) into ``docs/``.

Usage:
    .venv/bin/python benchmarks/tree_vs_chains.py --seeds 0 1 2 3 4          # runs what is missing, then reports
    .venv/bin/python benchmarks/tree_vs_chains.py --report                   # the table from what is there

Run it alone on the machine: runs take the 2 cores, and wall time is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.model_loading import load_policy, load_tokenizer  # noqa: E402
from lit_grpo.tasks.games import HiddenOperandsTask  # noqa: E402
from lit_grpo.tree_rollout import greedy_trees  # noqa: E402
from lit_grpo.tree import depth_first  # noqa: E402

GAMES = {"hidden-operands": ("data/tiny-llama-hidden", "lit_grpo.tasks.games.HiddenOperandsTask", HiddenOperandsTask)}
COMMON = ["--model.loss_variant", "clip", "--model.aggregation", "seq-mean", "--model.kl_coef", "0.04",
          "--data.prompts_per_epoch", "16", "--data.minibatch_size", "64", "--data.max_new_tokens", "5",
          "--data.val_max_prompts", "100"]
VARIANTS = {
    "tree-mean": ["--data.rollout", "tree", "--data.branching", "[4, 2, 2]", "--model.tree_value_mode", "mean"],
    "tree-optimal-stopping": ["--data.rollout", "tree", "--data.branching", "[4, 2, 2]",
                              "--model.tree_value_mode", "optimal_stopping"],
    "chains-grpo": ["--data.rollout", "chains", "--data.group_size", "8", "--data.branching", "[8, 1, 1]",
                    "--model.advantage_mode", "grpo"],
}
HELDOUT = 500
# Student's t 0.975 quantiles by degrees of freedom (no SciPy dependency for eleven numbers)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
ROUNDS = 3


def train(game: str, variant: str, seed: int, lr: float, budget: int, work: Path) -> tuple[Path, dict]:
    """One training run through the command: its adapter, and its training return per epoch, policy tokens
    generated and wall seconds."""
    model, task_path, _ = GAMES[game]
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--seed_everything", str(seed), "--data.seed", str(seed),
               "--model.model_name_or_path", model, "--data.task", task_path, *COMMON, *VARIANTS[variant],
               "--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", str(lr),
               "--model.optimizer.weight_decay", "0.0", "--data.completion_budget", str(budget),
               "--trainer.max_epochs", "100000", "--trainer.check_val_every_n_epoch", "100000",
               "--trainer.default_root_dir", str(work), "--trainer.enable_progress_bar", "false",
               "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(work)]
    started = time.time()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    seconds = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"{game}/{variant}/seed {seed} failed:\n{done.stderr[-3000:]}")
    (metrics,) = work.rglob("metrics.csv")
    curve, tokens = training_returns(metrics)
    (adapter,) = [p.parent for p in work.rglob("adapter_model.safetensors") if p.parent.name == "adapter"]
    return adapter, {"curve": curve, "policy_tokens": tokens, "seconds": seconds}


def training_returns(metrics: Path) -> tuple[list[float], float]:
    """The mean leaf return of each epoch's rollouts (``rollout/mean_return``), in epoch order, and the policy tokens
    generated over the run (``rollout/policy_tokens`` summed)."""
    import csv

    with metrics.open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("rollout/mean_return")]
    return [float(row["rollout/mean_return"]) for row in rows], sum(float(row["rollout/policy_tokens"]) for row in rows)


def evaluate(game: str, adapter: Path | None) -> dict[str, float]:
    """Greedy held-out episodes: mean return, accuracy and questions per episode."""
    model, _, task_class = GAMES[game]
    task = task_class()
    tokenizer = load_tokenizer(str(ROOT / model))
    policy = load_policy(str(ROOT / model), 16, 32, 0.0, "all-linear", init_adapter=None if adapter is None else
                         str(adapter), dtype="float32")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=5, stop_token_ids=(tokenizer.eos_token_id,))
    records = list(task.heldout_records())[:HELDOUT]
    with torch.no_grad():
        roots = greedy_trees(task, engine, tokenizer, records, ROUNDS, spec)
    returns, correct, questions = [], [], []
    for root in roots:
        path = depth_first(root)[1:]
        returns.append(sum(node.reward for node in path))
        correct.append(float(bool(getattr(path[-1], "correct", False))))
        questions.append(float(sum(getattr(node, "kind", "") == "ask" for node in path)))
    return {"return": statistics.fmean(returns), "accuracy": statistics.fmean(correct),
            "questions": statistics.fmean(questions), "oracle_return": task.oracle_return(records)}


def done_runs(results: Path) -> list[dict]:
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.is_file() else []


def run_missing(args: argparse.Namespace) -> None:
    have = {(r["game"], r["variant"], r["seed"], r["lr"], r["budget"]) for r in done_runs(args.results)}
    for game in args.games:
        if (game, "warm-start", 0, 0.0, 0) not in have:
            append(args.results, {"game": game, "variant": "warm-start", "seed": 0, "lr": 0.0, "budget": 0,
                                  **evaluate(game, None), "seconds": 0.0, "curve": [], "policy_tokens": 0.0})
        for seed in args.seeds:  # seed by seed: a table cut short still compares every variant
            for variant in args.variants:
                if (game, variant, seed, args.lr, args.budget) in have:
                    continue
                with tempfile.TemporaryDirectory() as work:
                    adapter, run = train(game, variant, seed, args.lr, args.budget, Path(work))
                    scores = evaluate(game, adapter)
                append(args.results, {"game": game, "variant": variant, "seed": seed, "lr": args.lr,
                                      "budget": args.budget, **scores, **run})
                print(f"{game} {variant} seed {seed}: return {scores['return']:.3f} accuracy {scores['accuracy']:.3f} "
                      f"questions {scores['questions']:.2f} ({run['seconds']:.0f} s, {run['policy_tokens']:.0f} "
                      "policy tokens)", flush=True)


def append(results: Path, row: dict) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as file:
        file.write(json.dumps(row) + "\n")


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value; 1.96 beyond the table)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    quantile = T_975.get(len(values) - 1, 1.96)
    return mean, quantile * statistics.stdev(values) / len(values) ** 0.5


def report(args: argparse.Namespace) -> None:
    rows = [r for r in done_runs(args.results) if r["lr"] in (args.lr, 0.0) and r["budget"] in (args.budget, 0)]
    for game in args.games:
        game_rows = [r for r in rows if r["game"] == game]
        warm = next(r for r in game_rows if r["variant"] == "warm-start")
        oracle = warm["oracle_return"]
        print(f"\n{game}: warm start return {warm['return']:.3f} (accuracy {warm['accuracy']:.3f}, questions "
              f"{warm['questions']:.2f}); oracle return {oracle:.3f}; budget {args.budget} segments, lr {args.lr}")
        print("| variant | seeds | held-out return | accuracy | questions / episode | gap closed | policy tokens | wall s |")
        print("|---|---|---|---|---|---|---|---|")
        for variant in args.variants:
            runs = [r for r in game_rows if r["variant"] == variant]
            if not runs:
                continue
            cells = [interval([r[key] for r in runs]) for key in ("return", "accuracy", "questions")]
            gap = [(r["return"] - warm["return"]) / (oracle - warm["return"]) for r in runs]
            g = interval(gap)
            print(f"| {variant} | {len(runs)} | " + " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in cells)
                  + f" | {g[0]:.0%} ± {g[1]:.0%} | {statistics.fmean(r['policy_tokens'] for r in runs):.0f} | "
                  f"{statistics.fmean(r['seconds'] for r in runs):.0f} |")
        plot(game, game_rows, args)


def plot(game: str, rows: list[dict], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for variant in args.variants:
        curves = [r["curve"] for r in rows if r["variant"] == variant and r["curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(length)]
        axes.plot(range(length), mean, label=f"{variant} ({len(curves)} seeds)")
    axes.set_xlabel("epoch")
    axes.set_ylabel("training return (mean over seeds)")
    axes.set_title(f"{game}: {args.budget} segments")
    axes.legend()
    out = ROOT / "docs" / f"tree_vs_chains_{game}.png"
    figure.savefig(out, dpi=100, bbox_inches="tight")
    print(f"learning curves: {out.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--budget", type=int, default=12000, help="policy segments generated per run")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "tree_vs_chains.jsonl")
    parser.add_argument("--report", action="store_true", help="only print the table from the results file")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if not args.report:
        run_missing(args)
    report(args)


if __name__ == "__main__":
    main()
