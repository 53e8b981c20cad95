"""Build the stockroom task's warm start, ``data/tiny-qwen2-stock``, and its rows, ``data/tool-stock/rows.jsonl``
(issue 58): the tool model of ``data/tiny-qwen2-tools`` (Qwen2.5's template and tool-call format) taught the
stockroom's tools imperfectly, so that RL has turns to credit.

- Rows: 3,000 shops (``lit_grpo.tasks.tools.stock.stock_rows``), 2 to 4 kinds each. The task is the shipped one
  (configs/tools_stock.yaml): the ``Stockroom`` environment, a reward per call, ``submit`` ends the episode.
  ``ToolTask``'s split (300 held out, seed 0) decides which rows train; only those are demonstrated.
- Model: ``data/tiny-qwen2-tools``' weights and tokenizer, trained further by teacher forcing on whole episodes built
  as the rollout builds them (prompt ids, each turn's ids then ``<|im_end|>``, the template's reply ids between
  turns), loss on the assistant turns only (``build_tool_model.train``).
- Demonstrations (one call a turn), per row: the plan (``count`` 1 to kinds, then ``submit``; ``--p-plan``); a plan
  stopped one kind short (``count`` 1 to kinds - 1, then ``submit``; ``--p-early``); the plan with a ``look`` before
  one of its counts (``--p-look``); or the plan with one kind counted twice (the rest). Stopping one short being
  the most common continuation there, greedy decoding submits before the last kind is counted on most held-out rows;
  sampling sometimes counts on.

Usage: ``.venv/bin/python scripts/build_stock_model.py`` (deterministic for the same libraries; prints the held-out
greedy and sampled figures and writes them into BUILD.md).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.rollout.trees import expand_trees, greedy_trees  # noqa: E402
from lit_grpo.tasks.tools.stock import SOLVED, Stockroom, stock_rows  # noqa: E402
from lit_grpo.tasks.tools.task import ToolTask  # noqa: E402
from lit_grpo.tree import depth_first  # noqa: E402
from scripts.build_tool_model import episode_ids, train  # noqa: E402

SOURCE = REPO_ROOT / "data" / "tiny-qwen2-tools"
MODEL_DIR = REPO_ROOT / "data" / "tiny-qwen2-stock"
ROWS = REPO_ROOT / "data" / "tool-stock" / "rows.jsonl"
MAX_TURNS = 6  # 4 counts and a submit, and one call to spare


def stock_task() -> ToolTask:
    """The shipped task's settings (configs/tools_stock.yaml), calls in the training process."""
    return ToolTask(path=str(ROWS), environment=Stockroom, turn_rewards="environment", max_turns=MAX_TURNS,
                    heldout_size=300, max_completion_length=384, tool_timeout=None)


def call_text(name: str, item: int | None = None) -> str:
    arguments = "{}" if item is None else f'{{"item": {item}}}'
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def demonstration(row: dict[str, Any], rng: random.Random, p_plan: float, p_early: float,
                  p_look: float) -> list[str]:
    """The assistant turns demonstrated for ``row`` (one call a turn): the plan, a plan one kind short, the plan with
    a ``look``, or the plan with a kind counted twice."""
    kinds = int(row["kinds"])
    counts = [call_text("count", item) for item in range(1, kinds + 1)]
    draw = rng.random()
    if draw < p_plan:
        turns = counts
    elif draw < p_plan + p_early:
        turns = counts[:-1]  # one kind short: the decision to count on before submitting
    elif draw < p_plan + p_early + p_look:
        at = rng.randint(0, kinds - 1)
        turns = [*counts[:at], call_text("look", at + 1), *counts[at:]]
    else:
        at = rng.randint(1, kinds)
        turns = [*counts[:at], counts[at - 1], *counts[at:]]
    return [*turns, call_text("submit")]


def root_paths(node: Any) -> list[list[Any]]:
    """Every path from ``node``'s children down to an ended node (one per episode of the tree)."""
    if node.terminal or not node.children:
        return [[node]]
    return [[node, *path] for child in node.children for path in root_paths(child)]


def episode_figures(roots: list[Any]) -> dict[str, float]:
    """Per episode (every path to a leaf): the mean return (the sum of its turns' rewards), the share solved (a
    return of at least ``SOLVED``: ``success_reward``, what ``val/accuracy`` counts) and the calls per episode."""
    paths = [path[1:] for root in roots for path in root_paths(root)]
    returns = [sum(node.reward for node in path) for path in paths]
    calls = [sum(path[-1].episode.calls.values()) for path in paths]
    return {"return": sum(returns) / len(returns), "solved": sum(r >= SOLVED for r in returns) / len(returns),
            "calls": sum(calls) / len(calls)}


def evaluate(task: ToolTask, path: Path, records: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out episodes: greedy, and 4 sampled episodes per row (temperature 1, what a rollout draws)."""
    from lit_grpo.policy.model_loading import load_policy

    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = load_policy(str(path), 4, 8, 0.0, "all-linear")
    engine = HFEngine()
    engine.push_policy(policy)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampling = SamplingSpec(max_new_tokens=32, stop_token_ids=(end,), seed=0)
    greedy = episode_figures(greedy_trees(task, engine, tokenizer, records, task.max_turns, sampling))
    sampled = episode_figures(expand_trees(task, engine, tokenizer, records, [4] + [1] * (task.max_turns - 1),
                                           sampling))
    return {**greedy, **{f"sampled_{k}": v for k, v in sampled.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--p-plan", type=float, default=0.2)
    parser.add_argument("--p-early", type=float, default=0.55)
    parser.add_argument("--p-look", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=MODEL_DIR)
    parser.add_argument("--evaluate-only", action="store_true")
    parser.add_argument("--eval-rows", type=int, default=100)
    options = parser.parse_args()
    torch.manual_seed(0)
    ROWS.parent.mkdir(parents=True, exist_ok=True)
    ROWS.write_text("".join(json.dumps(row) + "\n" for row in stock_rows(3000, seed=0)))
    task = stock_task()
    train_rows, validation, _ = task.split()
    start = time.perf_counter()
    if not options.evaluate_only:
        tokenizer = AutoTokenizer.from_pretrained(SOURCE)
        rng = random.Random(0)
        examples = [episode_ids(task, tokenizer, row, demonstration(row, rng, options.p_plan, options.p_early,
                                                                    options.p_look)) for row in train_rows]
        model = AutoModelForCausalLM.from_pretrained(SOURCE, dtype=torch.float32)
        losses = train(model, examples, options.steps, options.batch, options.lr, seed=0)
        model.save_pretrained(options.out)
        tokenizer.save_pretrained(options.out)
        shutil.copy(SOURCE / "generation_config.json", options.out / "generation_config.json")
        print(f"trained in {time.perf_counter() - start:.0f} s, final loss {sum(losses[-50:]) / 50:.4f}")
    figures = evaluate(task, options.out, validation[:options.eval_rows])
    print(json.dumps(figures))
    (options.out / "BUILD.md").write_text(build_notes(options, figures, time.perf_counter() - start))


def build_notes(options: argparse.Namespace, figures: dict[str, float], seconds: float) -> str:
    return f"""# tiny-qwen2-stock

The stockroom task's warm start (configs/tools_stock.yaml; issue 58): `data/tiny-qwen2-tools` (a tiny Qwen2 chat model
speaking Qwen2.5's tool-call format through Qwen2.5's own template; its BUILD.md) taught the stockroom's tools
imperfectly, so that RL has turns to credit.

Rebuilt by:

    .venv/bin/python scripts/build_stock_model.py

- trained from data/tiny-qwen2-tools' weights for {options.steps} steps (batch {options.batch}, peak lr {options.lr},
  seed 0) on the training rows of data/tool-stock/rows.jsonl, one call a turn: the plan (`count` 1 to kinds, then
  `submit`; p {options.p_plan}), the plan one kind short (p {options.p_early}), the plan with a `look` (p {options.p_look}),
  or the plan with one kind counted twice (the rest)
- greedy held-out episodes ({options.eval_rows} validation rows, <= {MAX_TURNS} turns): mean return
  {figures['return']:.3f}, solved {figures['solved']:.3f}, calls per episode {figures['calls']:.2f}
- sampled held-out episodes (4 per row, temperature 1): mean return {figures['sampled_return']:.3f}, solved
  {figures['sampled_solved']:.3f}, calls per episode {figures['sampled_calls']:.2f}
- wall time: {seconds:.0f} s on 2 CPU cores

The task (`lit_grpo.tasks.tools.stock.Stockroom`): a shop stocks 2 to 4 kinds of item, numbered; `count(item)` adds
a kind's stock to the register (+0.2 the first time for a kind on the list, -0.2 otherwise), `look(item)` says where
a kind is shelved (-0.2: never needed), `submit()` ends the episode (+1 when every kind was counted, else 0).
"""


if __name__ == "__main__":
    main()
