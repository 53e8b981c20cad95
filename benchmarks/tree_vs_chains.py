"""Tree rollouts against chains on the multi-round games, at an equal budget of generated segments, over seeds.

Each run trains through the ``lit-grpo`` command from the game's warm-start model until ``--budget`` policy segments
(every round's completion counted, ``data.completion_budget``) are spent, then plays the held-out prompts greedily
(the game's rounds: 3, or 4 for the decision-hard stale-digits game) with the saved adapter: mean return, accuracy, questions per episode. Per game, every variant first
gets the same learning-rate sweep (``SWEEP_LRS``) on ``--sweep-seed``; the best held-out return there fixes its rate
for ``--seeds``. Each finished run is appended to ``--results`` (JSON lines, tagged with the warm start's hash) and
skipped when found there, so the table can be built over several sittings or extended with other seeds. The decision
signal of each rollout shape (``decision_signal.py``) is measured once per game at the warm start. ``--report``
prints the tables (mean and 95% t-interval over seeds, the share of the warm-start-to-oracle gap closed) and draws
each game's learning curves (training return per epoch) into ``docs/``.

The decision-hard game (issue 35, ``stale-digits``, 4 rounds) is the default; its variants are the two tree
value modes at ``[4, 2, 2, 2]``, a tree whose last-round answers are sampled 8 wide (``[2, 2, 2, 8]``), and chains
(8 episodes) with GRPO and with PPO, at 10,000 segments per run.

Usage:
    .venv/bin/python benchmarks/tree_vs_chains.py                  # runs what is missing, then reports
    .venv/bin/python benchmarks/tree_vs_chains.py --report         # the tables from what is there
    .venv/bin/python benchmarks/tree_vs_chains.py --games calculator --seeds 6 7   # an earlier game

Run it alone on the machine: runs take the 2 cores, and wall time is reported.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
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
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask  # noqa: E402
from lit_grpo.tasks.stale_digits import StaleDigitsTask  # noqa: E402
from lit_grpo.rollout.trees import greedy_trees  # noqa: E402
from lit_grpo.tree import depth_first  # noqa: E402
from decision_signal import SHAPES, decision_signal, widths_for  # noqa: E402

GAMES = {"hidden-operands": ("data/tiny-llama-hidden", "lit_grpo.tasks.games.HiddenOperandsTask", HiddenOperandsTask),
         "calculator": ("data/tiny-llama-calculator", "lit_grpo.tasks.games.CalculatorTask", CalculatorTask),
         "stale-digits": ("data/tiny-llama-stale", "lit_grpo.tasks.stale_digits.StaleDigitsTask",
                            StaleDigitsTask)}
GAME_ROUNDS = {"hidden-operands": 3, "calculator": 3, "stale-digits": 4}  # rollout depth and evaluation rounds
# the variants each game's table compares (the decision-hard game: the ones issue 35 names)
GAME_VARIANTS = {"stale-digits": ["tree-mean", "tree-optimal-stopping", "tree-wide-answers", "chains-grpo",
                                    "chains-ppo"]}
COMMON = ["--model.loss_variant", "clip", "--model.aggregation", "seq-mean", "--model.kl_coef", "0.04",
          "--data.prompts_per_epoch", "16", "--data.minibatch_size", "64", "--data.max_new_tokens", "5",
          "--data.val_max_prompts", "100"]
VARIANTS = {  # the arguments of each variant; BRANCHING is the widths of a 3-round game (widths_for stretches them)
    "tree-mean": ["--data.rollout", "tree", "--data.branching", "BRANCHING", "--model.tree_value_mode", "mean"],
    "tree-optimal-stopping": ["--data.rollout", "tree", "--data.branching", "BRANCHING",
                              "--model.tree_value_mode", "optimal_stopping"],
    "tree-os-sibling-std": ["--data.rollout", "tree", "--data.branching", "BRANCHING",
                            "--model.tree_value_mode", "optimal_stopping", "--model.tree_std_scope", "siblings"],
    # the last round's answers compared 8 at a time, as a chain group compares its 8 episodes
    "tree-wide-answers": ["--data.rollout", "tree", "--data.branching", "BRANCHING",
                          "--model.tree_value_mode", "optimal_stopping"],
    "chains-grpo": ["--data.rollout", "chains", "--data.group_size", "8", "--data.branching", "BRANCHING",
                    "--model.advantage_mode", "grpo"],
    "chains-ppo": ["--data.rollout", "chains", "--data.group_size", "8", "--data.branching", "BRANCHING",
                   "--model.advantage_mode", "gae", "--model.gamma", "1.0", "--model.gae_lambda", "0.95"],
}
WIDTHS = {"tree-mean": [4, 2, 2], "tree-optimal-stopping": [4, 2, 2], "tree-os-sibling-std": [4, 2, 2],
          "tree-wide-answers": [2, 2, 8], "chains-grpo": [8, 1, 1], "chains-ppo": [8, 1, 1]}


GAME_BUDGET = {"stale-digits": 10000}  # four rounds of cue-dependent decisions: 4,000 segments left every variant
# at "never ask" (return ~0.08 against the oracle's 0.644; seed-0 runs at lr 2.5e-4)


def budget_of(args: argparse.Namespace, game: str) -> int:
    """Policy segments per run: ``--budget``, else the game's (4,000 for the earlier games)."""
    return args.budget or GAME_BUDGET.get(game, 4000)


def variants_of(args: argparse.Namespace, game: str) -> list[str]:
    """The variants compared on ``game``: ``--variants``, else the game's own list, else the first five."""
    return args.variants or GAME_VARIANTS.get(game, [v for v in VARIANTS if v != "tree-wide-answers"])


def variant_arguments(variant: str, game: str) -> list[str]:
    """``VARIANTS[variant]`` with its widths stretched to the game's rounds."""
    widths = str(widths_for(WIDTHS[variant], GAME_ROUNDS[game]))
    return [widths if argument == "BRANCHING" else argument for argument in VARIANTS[variant]]
SWEEP_LRS = (2.5e-4, 5e-4, 1e-3)  # every variant's learning rates on the sweep seed
HELDOUT = 500
# Student's t 0.975 quantiles by degrees of freedom (no SciPy dependency for eleven numbers)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def train(game: str, variant: str, seed: int, lr: float, budget: int, work: Path) -> tuple[Path, dict]:
    """One training run through the command: its adapter, and its training return per epoch, policy tokens
    generated and wall seconds."""
    model, task_path, _ = GAMES[game]
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--seed_everything", str(seed), "--data.seed", str(seed),
               "--model.model_name_or_path", model, "--data.task", task_path, *COMMON, *variant_arguments(variant, game),
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
        roots = greedy_trees(task, engine, tokenizer, records, GAME_ROUNDS[game], spec)
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


@functools.cache  # the weights do not change during a run; hashing 12 MB per results row did
def model_id(game: str) -> str:
    """The first 12 hex digits of the warm-start weights' sha256: rows of another warm start never mix in."""
    return hashlib.sha256((ROOT / GAMES[game][0] / "model.safetensors").read_bytes()).hexdigest()[:12]


def chosen_lrs(rows: list[dict], game: str, args: argparse.Namespace) -> dict[str, float]:
    """Each variant's learning rate: the best held-out return on the sweep seed (ties: the smaller rate)."""
    chosen = {}
    for variant in variants_of(args, game):
        sweep = [r for r in rows if r["game"] == game and r["variant"] == variant and r["seed"] == args.sweep_seed
                 and r.get("budget") == budget_of(args, game)]
        if {r["lr"] for r in sweep} >= set(SWEEP_LRS):
            chosen[variant] = max(sweep, key=lambda r: (r["return"], -r["lr"]))["lr"]
    return chosen


def run_one(args: argparse.Namespace, game: str, variant: str, seed: int, lr: float) -> None:
    key = (game, variant, seed, lr, budget_of(args, game))
    if any((r["game"], r["variant"], r.get("seed"), r.get("lr"), r.get("budget")) == key for r in current(args, game)):
        return
    with tempfile.TemporaryDirectory() as work:
        adapter, run = train(game, variant, seed, lr, budget_of(args, game), Path(work))
        scores = evaluate(game, adapter)
    append(args.results, {"game": game, "model": model_id(game), "variant": variant, "seed": seed, "lr": lr,
                          "budget": budget_of(args, game), **scores, **run})
    print(f"{game} {variant} seed {seed} lr {lr}: return {scores['return']:.3f} accuracy {scores['accuracy']:.3f} "
          f"questions {scores['questions']:.2f} ({run['seconds']:.0f} s, {run['policy_tokens']:.0f} policy tokens)",
          flush=True)


def current(args: argparse.Namespace, game: str) -> list[dict]:
    """The results rows of ``game`` made with today's warm start."""
    model = model_id(game)
    return [r for r in done_runs(args.results) if r["game"] == game and r.get("model") == model]


def run_missing(args: argparse.Namespace) -> None:
    """Per game: the warm start's scores and decision signal, the sweep on the sweep seed (every variant, every
    rate in ``SWEEP_LRS``), then the other seeds seed by seed at each variant's chosen rate (a table cut short still
    compares every variant)."""
    for game in args.games:
        rows = current(args, game)
        model, _, task_class = GAMES[game]
        if not any(r["variant"] == "warm-start" for r in rows):
            append(args.results, {"game": game, "model": model_id(game), "variant": "warm-start", "seed": 0, "lr": 0.0,
                                  "budget": 0, **evaluate(game, None), "seconds": 0.0, "curve": [],
                                  "policy_tokens": 0.0})
        for variant in SHAPES:
            if not any(r["variant"] == f"signal:{variant}" for r in rows):
                append(args.results, {"game": game, "model": model_id(game), "variant": f"signal:{variant}",
                                      **decision_signal(str(ROOT / model), task_class(), variant,
                                                        rounds=GAME_ROUNDS[game])})
        for lr in SWEEP_LRS:
            for variant in variants_of(args, game):
                run_one(args, game, variant, args.sweep_seed, lr)
        chosen = chosen_lrs(current(args, game), game, args)
        for seed in args.seeds:
            for variant in variants_of(args, game):
                run_one(args, game, variant, seed, chosen[variant])


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
    for game in args.games:
        rows = [r for r in current(args, game) if r.get("budget") in (budget_of(args, game), 0, None)]
        warm = next((r for r in rows if r["variant"] == "warm-start"), None)
        if warm is None:
            continue
        oracle = warm["oracle_return"]
        print(f"\n{game} (warm start {model_id(game)}): warm-start return {warm['return']:.3f} (accuracy "
              f"{warm['accuracy']:.3f}, questions {warm['questions']:.2f}); oracle return {oracle:.3f}; budget "
              f"{budget_of(args, game)} segments per run")
        chosen = chosen_lrs(rows, game, args)
        print(f"\nlearning-rate sweep, seed {args.sweep_seed}, held-out return:")
        print("| variant | " + " | ".join(f"lr {lr:g}" for lr in SWEEP_LRS) + " | chosen |")
        print("|---|" + "---|" * (len(SWEEP_LRS) + 1))
        for variant in variants_of(args, game):
            cells = [next((f"{r['return']:.3f}" for r in rows if r["variant"] == variant and r["lr"] == lr
                           and r["seed"] == args.sweep_seed), "-") for lr in SWEEP_LRS]
            print(f"| {variant} | " + " | ".join(cells) + f" | {chosen.get(variant, '-')} |")
        print(f"\nseeds {' '.join(map(str, args.seeds))} at the chosen rates (mean ± 95% t-interval):")
        print("| variant | seeds | held-out return | accuracy | questions / episode | gap closed | policy tokens | wall s |")
        print("|---|---|---|---|---|---|---|---|")
        finals = {}
        for variant in variants_of(args, game):
            runs = [r for r in rows if r["variant"] == variant and r["seed"] in args.seeds
                    and r["lr"] == chosen.get(variant)]
            if not runs:
                continue
            finals[variant] = runs
            cells = [interval([r[key] for r in runs]) for key in ("return", "accuracy", "questions")]
            g = interval([(r["return"] - warm["return"]) / (oracle - warm["return"]) for r in runs])
            print(f"| {variant} | {len(runs)} | " + " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in cells)
                  + f" | {g[0]:.0%} ± {g[1]:.0%} | {statistics.fmean(r['policy_tokens'] for r in runs):.0f} | "
                  f"{statistics.fmean(r['seconds'] for r in runs):.0f} |")
        print("\ndecision signal at the warm start (benchmarks/decision_signal.py; 40 held-out prompts x 8 rollouts):")
        print("| variant | sign agrees with the oracle | median SNR | both kinds sampled | episodes per first "
              "segment | segments per prompt |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            if r["variant"].startswith("signal:"):
                print(f"| {r['variant'][7:]} | {r['agreement']:.3f} | {r['snr']:.2f} | {r['defined']:.2f} | "
                      f"{r['episodes_per_decision']:.2f} | {r['segments']:.1f} |")
        plot(game, finals, args)


def plot(game: str, finals: dict[str, list[dict]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for variant, runs in finals.items():
        curves = [r["curve"] for r in runs if r["curve"]]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(length)]
        axes.plot(range(length), mean, label=f"{variant} ({len(curves)} seeds)")
    axes.set_xlabel("epoch (16 prompts each, the same prompts in every run)")
    axes.set_ylabel("training return (mean over seeds)")
    axes.set_title(f"{game}: {budget_of(args, game)} segments per run, at each variant's chosen lr")
    axes.legend()
    out = ROOT / "docs" / f"tree_vs_chains_{game}.png"
    figure.savefig(out, dpi=100, bbox_inches="tight")
    print(f"learning curves: {out.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=["stale-digits"], choices=list(GAMES),
                        help="default: the decision-hard game (issue 35); the earlier games' rows are kept")
    parser.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS),
                        help="default: the game's variants (GAME_VARIANTS), else all but tree-wide-answers")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5])
    parser.add_argument("--sweep-seed", type=int, default=0, help="the seed of every variant's learning-rate sweep")
    parser.add_argument("--budget", type=int, default=None, help="policy segments generated per run (default: "
                        "the game's, GAME_BUDGET, else 4000)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "tree_vs_chains.jsonl")
    parser.add_argument("--report", action="store_true", help="only print the table from the results file")
    args = parser.parse_args()
    torch.set_num_threads(2)
    if not args.report:
        run_missing(args)
    report(args)


if __name__ == "__main__":
    main()
