"""One run of benchmarks/research/turns/stock_credit.py: train an arm through the ``lit-grpo`` command on the
stockroom task (configs/tools_stock.yaml) to a budget of policy tokens, play the validation and test prompts
greedily with its adapter, read each turn's action, and append the row to the results file. Its own process, so
that the scheduler can run two at once with one torch thread each.

    .venv/bin/python benchmarks/research/turns/stock_run.py '{"arm": ..., "seed": ..., "lr": ..., "budget": ...,
        "results": ..., "threads": ...}'
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for lit_grpo and benchmarks.*

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.rollout.trees import greedy_trees  # noqa: E402
from lit_grpo.run.model_files import load_tokenizer  # noqa: E402
from lit_grpo.tasks.tools.stock import SOLVED, Stockroom  # noqa: E402
from lit_grpo.tasks.tools.task import ToolTask  # noqa: E402

from benchmarks.research.trees.tree_vs_chains_run import round_shares  # noqa: E402
from benchmarks.result_rows import append_row  # noqa: E402
from benchmarks.timed_child import fit_command, run_child  # noqa: E402

MODEL = "data/tiny-qwen2-stock"
ROWS = "data/tool-stock/rows.jsonl"
ARMS = {
    # all three optimise the same return (the sum of the calls' rewards), without a std, with a leave-one-out or
    # sibling baseline; they differ only in how the credit reaches each turn
    "chains-episode": ["--model.advantage_mode", "rloo", "--model.turn_credit", "episode"],
    "chains-turns": ["--model.advantage_mode", "rloo", "--model.turn_credit", "reward_to_go"],
    # pairs at the first three turns (8 leaves a prompt): below the root every sibling group is a pair, where the
    # split value takes the mean, so `mean` is the value
    "tree-turns": ["--data.rollout", "tree", "--data.branching", "[2,2,2,1,1,1]", "--model.tree.value_mode", "mean",
                   "--model.tree.std_scope", "none"],
}
# the ablation of where the tree's pairs sit (run at tree-turns's rate, without a grid of its own): at turns 3-5,
# where the warm start's choice between counting a kind and submitting falls, instead of 1-3; 8 leaves a prompt
ABLATION_ARMS = {
    "tree-turns-late": ["--data.rollout", "tree", "--data.branching", "[1,1,2,2,2,1]", "--model.tree.value_mode",
                        "mean", "--model.tree.std_scope", "none"],
}
ENGINES = {"hf": [], "vllm": ["--data.engine", "lit_grpo.engines.VLLMEngine", "--data.engine.init_args.dtype",
                              "float32", "--data.engine.init_args.kv_cache_gib", "1.0"]}


def model_id() -> str:
    """The first 12 hex digits of the warm start's sha256: rows of another warm start never mix in."""
    return hashlib.sha256((ROOT / MODEL / "model.safetensors").read_bytes()).hexdigest()[:12]


def stock_task() -> ToolTask:
    """configs/tools_stock.yaml's task, its calls in this process (greedy evaluation only)."""
    return ToolTask(path=str(ROOT / ROWS), environment=Stockroom, turn_rewards="environment", max_turns=6,
                    max_completion_length=384, heldout_size=300, tool_timeout=None)


def train(run: dict[str, Any], work: Path) -> tuple[Path, dict[str, Any]]:
    """One training run through the command: its adapter, and its training return and policy tokens per epoch, the
    per-turn shares of rows with advantage exactly 0, and its wall seconds."""
    budget = json.dumps({"class_path": "benchmarks.research.trees.token_budget.PolicyTokenBudget",
                         "init_args": {"budget": run["budget"]}})
    logger = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(work)]
    arm = {**ARMS, **ABLATION_ARMS}[run["arm"]]
    then = [*arm, *ENGINES[run.get("engine", "hf")], "--model.optimizer.lr", str(run["lr"]),
            f"--trainer.callbacks+={budget}",
            "--trainer.max_epochs", "100000", "--trainer.check_val_every_n_epoch", "100000",
            "--trainer.num_sanity_val_steps", "0", "--data.val_max_prompts", "2", "--metrics.table_every_n_epochs",
            "0", "--data.task.init_args.tool_timeout", "null"]
    command = fit_command(["--config", "configs/tools_stock.yaml"], run["seed"], work, logger, then)
    threads = str(run["threads"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    done = run_child(command, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{run} failed:\n{done.stderr[-3000:]}")
    (metrics,) = work.rglob("metrics.csv")
    with metrics.open() as file:
        rows = [row for row in csv.DictReader(file) if row.get("rollout/mean_return")]
    (adapter,) = [p.parent for p in work.rglob("adapter_model.safetensors") if p.parent.name == "adapter"]
    shares = round_shares(rows)  # each turn's share of the rows, and of its rows with advantage exactly 0
    turns = sorted(int(k.removeprefix("rows_round")) for k in shares if k.startswith("rows_round"))
    credit = {f"turn{d}": [shares[f"rows_round{d}"], shares[f"zero_advantage_round{d}"]] for d in turns}
    return adapter, {"curve": [float(r["rollout/mean_return"]) for r in rows],
                     "tokens": [float(r["rollout/policy_tokens"]) for r in rows],
                     "policy_tokens": sum(float(r["rollout/policy_tokens"]) for r in rows), "epochs": len(rows),
                     "turn_credit": credit, "seconds": done.seconds}


def turn_action(node: Any, kinds: int, counted: set[int]) -> str:
    """What one greedy turn did: ``count`` (a kind not counted yet), ``recount`` (counted already, or not
    stocked), ``look``, ``submit-solved``, ``submit-early``, ``text`` (no call: the episode ends) or ``other``
    (a malformed or cut turn, several calls)."""
    calls = node.episode.turns[-1].calls if node.kind in ("call", "finished") and node.episode.turns else ()
    if node.kind == "answer":
        return "text"
    if len(calls) != 1:
        return "other"
    name = calls[0].get("function", calls[0]).get("name")
    arguments = calls[0].get("function", calls[0]).get("arguments") or {}
    if isinstance(arguments, str):
        arguments = json.loads(arguments)
    if name == "count":
        item = arguments.get("item")
        fresh = isinstance(item, int) and 1 <= item <= kinds and item not in counted
        counted.add(item)
        return "count" if fresh else "recount"
    if name == "submit":
        return "submit-solved" if counted >= set(range(1, kinds + 1)) else "submit-early"
    return name if name == "look" else "other"


def evaluate(adapter: Path | None) -> dict[str, Any]:
    """Greedy episodes on the validation prompts (which choose rates) and the test prompts (the tables'): the mean
    return, the share solved, calls per episode and each turn's actions."""
    task = stock_task()
    tokenizer = load_tokenizer(str(ROOT / MODEL))
    policy = load_policy(str(ROOT / MODEL), 16, 32.0, 0.0, "all-linear", init_adapter=None if adapter is None else
                         str(adapter), dtype="float32")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=32, stop_token_ids=(tokenizer.convert_tokens_to_ids("<|im_end|>"),))
    _, validation, test = task.split()
    scores: dict[str, Any] = {}
    for split, records in (("val", validation), ("test", test)):
        with torch.no_grad():
            roots = greedy_trees(task, engine, tokenizer, records, task.max_turns, spec)
        returns, actions = [], Counter()
        for root, record in zip(roots, records):
            path, node, counted = [], root, set()
            while node.children:
                node = node.children[0]
                path.append(node)
            returns.append(sum(n.reward for n in path))
            for turn, step in enumerate(path, start=1):
                actions[f"turn{turn}/{turn_action(step, int(record['kinds']), counted)}"] += 1
        scores[f"{split}_return"] = statistics.fmean(returns)
        scores[f"{split}_solved"] = statistics.fmean(r >= SOLVED for r in returns)
        scores[f"{split}_actions"] = {k: v / len(records) for k, v in sorted(actions.items())}
        scores[f"{split}_prompts"] = len(records)
    return scores


def main() -> None:
    run = json.loads(sys.argv[1])
    torch.set_num_threads(run["threads"])
    row = {"model": model_id(), **{k: run[k] for k in ("arm", "seed", "lr", "budget", "threads")}}
    if run["arm"] == "warm-start":
        row.update(evaluate(None), curve=[], tokens=[], epochs=0, policy_tokens=0.0, seconds=0.0)
    else:
        with tempfile.TemporaryDirectory() as work:
            adapter, trained = train(run, Path(work))
            row.update(evaluate(adapter), **trained)
    append_row(Path(run["results"]), row)
    print(f"{run['arm']} seed {run['seed']} lr {run['lr']}: test return {row['test_return']:.3f} (val "
          f"{row['val_return']:.3f}), solved {row['test_solved']:.2f}, {row['policy_tokens']:.0f} policy tokens, "
          f"{row['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
