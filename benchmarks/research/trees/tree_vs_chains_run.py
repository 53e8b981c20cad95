"""One run of benchmarks/research/trees/tree_vs_chains.py (protocol 3): train through the ``lit-grpo`` command to a
budget of policy tokens, play the held-out prompts greedily, append the row to the results file (under a lock: two runs
may finish at once). Its own process, so the scheduler can run two with one torch thread each.

Each row holds the run's decisions (``decision_tables.py``): its greedy actions per information state and return per
cue on the validation and test prompts, and what its training rollouts sampled per state with the advantages they
got (over the whole run and its first 10 epochs; every epoch's counts in the decisions folder beside the results),
and the per-round shares of rows with advantage exactly 0.

    .venv/bin/python benchmarks/research/trees/tree_vs_chains_run.py '{"game": ..., "variant": ..., "seed": ..., "lr": ...,
        "budget": ..., "results": ..., "threads": ...}'
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for lit_grpo and benchmarks.*

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.rollout.trees import greedy_trees  # noqa: E402
from lit_grpo.run.model_files import load_tokenizer  # noqa: E402
from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask  # noqa: E402
from lit_grpo.tasks.games.stale_digits import StaleDigitsTask  # noqa: E402
from lit_grpo.tree import depth_first  # noqa: E402

from benchmarks.research.trees.decision_tables import cue_free_policies, greedy_table, sampled_summary  # noqa: E402
from benchmarks.result_rows import append_row  # noqa: E402
from benchmarks.timed_child import run_child  # noqa: E402

PROTOCOL = 3
GAMES = {"hidden-operands": ("data/tiny-llama-hidden", "lit_grpo.tasks.games.operands.HiddenOperandsTask", HiddenOperandsTask),
         "calculator": ("data/tiny-llama-calculator", "lit_grpo.tasks.games.calculator.CalculatorTask", CalculatorTask),
         "stale-digits": ("data/tiny-llama-stale", "lit_grpo.tasks.games.stale_digits.StaleDigitsTask", StaleDigitsTask)}
ORDERED_GAMES = {"stale-digits", "hidden-operands", "calculator"}  # tasks with a train_order_seed
COMMON = ["--model.loss_variant", "clip", "--model.aggregation", "seq-mean", "--model.kl.coef", "0.04",
          "--data.prompts_per_epoch", "16", "--data.minibatch_size", "64", "--data.max_new_tokens", "5",
          "--data.val_max_prompts", "8"]  # the command's own validation before training: cheap, unused here


def model_id(game: str) -> str:
    """The first 12 hex digits of the warm-start weights' sha256: rows of another warm start never mix in."""
    return hashlib.sha256((ROOT / GAMES[game][0] / "model.safetensors").read_bytes()).hexdigest()[:12]


def train(run: dict, arguments: list[str], work: Path) -> tuple[Path, dict]:
    """One training run through the command: its adapter, and its training return per epoch, policy tokens
    generated, epochs, wall seconds, the per-round shares of zero advantages and the sampled decisions."""
    model, task_path, _ = GAMES[run["game"]]
    seed = str(run["seed"])
    order = ["--data.task.init_args.train_order_seed", seed] if run["game"] in ORDERED_GAMES else []
    budget = json.dumps({"class_path": "benchmarks.research.trees.token_budget.PolicyTokenBudget",
                         "init_args": {"budget": run["budget"]}})
    log_path = decisions_file(run)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = json.dumps({"class_path": "benchmarks.research.trees.decision_tables.DecisionLog",
                      "init_args": {"path": str(log_path)}})
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--seed_everything", seed, "--data.seed", seed,
               "--model.model_name_or_path", model, "--data.task", task_path, *order, *COMMON, *arguments,
               "--model.optimizer", "torch.optim.AdamW", "--model.optimizer.lr", str(run["lr"]),
               "--model.optimizer.weight_decay", "0.0", f"--trainer.callbacks+={budget}", f"--trainer.callbacks+={log}",
               "--trainer.max_epochs", "100000", "--trainer.check_val_every_n_epoch", "100000",
               "--trainer.num_sanity_val_steps", "0", "--trainer.enable_checkpointing", "false",
               "--trainer.default_root_dir", str(work), "--trainer.enable_progress_bar", "false",
               "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(work)]
    threads = str(run["threads"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads,
           "MKL_NUM_THREADS": threads}
    done = run_child(command, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{run} failed:\n{done.stderr[-3000:]}")
    (metrics,) = work.rglob("metrics.csv")
    with metrics.open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("rollout/mean_return")]
    (adapter,) = [p.parent for p in work.rglob("adapter_model.safetensors") if p.parent.name == "adapter"]
    credit = round_shares(rows)
    epochs = json.loads(log_path.read_text())["epochs"] if log_path.is_file() else []
    return adapter, {"curve": [float(row["rollout/mean_return"]) for row in rows], "epochs": len(rows),
                     "policy_tokens": sum(float(row["rollout/policy_tokens"]) for row in rows), "seconds": done.seconds,
                     "round_credit": credit, "sampled": sampled_summary(epochs),
                     "sampled_first10": sampled_summary(epochs, 10)}


def round_shares(rows: list[dict]) -> dict[str, float]:
    """Over a run's epochs (``metrics.csv`` rows): each round's share of all policy rows (``rows_round{d}``) and the
    share of its rows with advantage exactly 0 (``zero_advantage_round{d}``), pooled; {} for grouped rollouts."""
    def total(key: str) -> float:
        return sum(float(row[key]) for row in rows if row.get(key))

    rounds = sorted(int(k.removeprefix("rollout/rows_round")) for k in rows[0] if k.startswith("rollout/rows_round"))
    every = sum(total(f"rollout/rows_round{d}") for d in rounds)
    shares: dict[str, float] = {}
    for d in rounds:
        at_d = total(f"rollout/rows_round{d}")
        shares[f"rows_round{d}"] = at_d / every if every else 0.0
        shares[f"zero_advantage_round{d}"] = total(f"rollout/zero_advantage_rows_round{d}") / at_d if at_d else 0.0
    return shares


def decisions_file(run: dict) -> Path:
    """Where a run's training decisions go, epoch by epoch (beside the results file)."""
    folder = Path(run["results"]).with_suffix("")
    return folder.parent / f"{folder.name}_decisions" / (marker(run).name + ".json")


def episode_scores(task, roots) -> dict[str, float]:
    """Mean return, accuracy and questions per episode of greedy single-path trees."""
    returns, correct, questions = [], [], []
    for root in roots:
        path = depth_first(root)[1:]
        returns.append(sum(node.reward for node in path))
        correct.append(float(bool(getattr(path[-1], "correct", False))))
        questions.append(float(sum(getattr(node, "kind", "") == "ask" for node in path)))
    return {"return": statistics.fmean(returns), "accuracy": statistics.fmean(correct),
            "questions": statistics.fmean(questions)}


def answer_at_once(task, records) -> float:
    """The return of answering every prompt at once with what it shows (the policy that never asks)."""
    if hasattr(task, "stale_probabilities"):
        return statistics.fmean(task.correct_reward if not r["stale"] else task.wrong_reward for r in records)
    return statistics.fmean(task.correct_reward if not task.oracle_questions(r) else task.wrong_reward
                            for r in records)


def evaluate(game: str, adapter: Path | None) -> dict[str, Any]:
    """Greedy episodes on the validation prompts (which choose rates) and the test prompts (which the table
    reports), apart, with each split's oracle and answer-at-once returns."""
    model, _, task_class = GAMES[game]
    task = task_class()
    tokenizer = load_tokenizer(str(ROOT / model))
    policy = load_policy(str(ROOT / model), 16, 32, 0.0, "all-linear", init_adapter=None if adapter is None else
                         str(adapter), dtype="float32")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=5, stop_token_ids=(tokenizer.eos_token_id,))
    scores: dict[str, Any] = {}
    for split, records in (("val", list(task.validation_records())), ("test", list(task.test_records()))):
        with torch.no_grad():
            roots = greedy_trees(task, engine, tokenizer, records, task.max_rounds, spec)
        scores.update({f"{split}_{k}": v for k, v in episode_scores(task, roots).items()})
        scores[f"{split}_decisions"] = greedy_table(task, roots)
        scores[f"{split}_cue_free"] = cue_free_policies(task, records)
        scores[f"{split}_oracle"] = task.oracle_return(records)
        scores[f"{split}_answer_at_once"] = answer_at_once(task, records)
        scores[f"{split}_prompts"] = len(records)
    return scores


def marker(run: dict) -> Path:
    """The file that says this run is going (its pid inside), so a scheduler started again does not repeat it."""
    folder = Path(run["results"]).with_suffix(".running")
    return folder / f"{run['game']}_{run['variant']}_{run['seed']}_{run['lr']}_{run['budget']}"


def main() -> None:
    run = json.loads(sys.argv[1])
    going = marker(run)
    going.parent.mkdir(parents=True, exist_ok=True)
    going.write_text(str(os.getpid()))
    try:
        one_run(run)
    finally:
        going.unlink(missing_ok=True)


def one_run(run: dict) -> None:
    torch.set_num_threads(run["threads"])
    row = {"protocol": PROTOCOL, "model": model_id(run["game"]), **{k: run[k] for k in
           ("game", "variant", "seed", "lr", "budget", "threads")}}
    if run["variant"] == "warm-start":
        row.update(evaluate(run["game"], None), curve=[], epochs=0, policy_tokens=0.0, seconds=0.0)
    else:
        with tempfile.TemporaryDirectory() as work:
            adapter, trained = train(run, run["arguments"], Path(work))
            row.update(evaluate(run["game"], adapter), **trained)
    row["arguments"] = run.get("arguments", [])
    append_row(Path(run["results"]), row)
    print(f"{run['game']} {run['variant']} seed {run['seed']} lr {run['lr']} budget {run['budget']}: test return "
          f"{row['test_return']:.3f} (val {row['val_return']:.3f}), questions {row['test_questions']:.2f}, "
          f"{row['policy_tokens']:.0f} policy tokens, {row['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
