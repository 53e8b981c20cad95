"""Build ``data/tiny-llama-clarify``: the shipped tiny model taught the clarification game's protocol.

Fine-tunes ``data/tiny-llama`` by teacher forcing on the game's *training* split only. Every prompt, hidden or
not, is shown both ways with equal odds: asking (``?``, the environment's ``b=..;``, then the sum) and answering at
once (the sum, or for a hidden b a guess). So the model knows how to ask and how to answer but has no preference
for when: that is what GRPO or tree-relative training must learn. A share of plain addition keeps the skill.

Usage: ``.venv/bin/python scripts/build_clarify_model.py`` (deterministic; prints held-out figures).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.model_loading import load_policy  # noqa: E402
from lit_grpo.tasks import ClarifyTask  # noqa: E402
from lit_grpo.tree_rollout import greedy_episodes  # noqa: E402

IGNORE = -100


def protocol_example(tokenizer, record: dict, rng: random.Random) -> tuple[list[int], list[int]]:
    """Token ids and labels of one episode; the prompt and the environment's reply carry no label."""
    eos = tokenizer.eos_token_id
    ids = tokenizer(record["prompt"])["input_ids"]
    labels = [IGNORE] * len(ids)

    def say(text: str, learn: bool) -> None:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if learn else [])
        ids.extend(piece)
        labels.extend(piece if learn else [IGNORE] * len(piece))

    if rng.random() < 0.5:
        say("?", learn=True)
        say(f"b={record['b']};", learn=False)
        say(record["answer"], learn=True)
    else:
        guess = record["a"] + rng.randint(10, 99) if record["hidden"] else int(record["answer"])
        say(str(guess), learn=True)
    return ids, labels


def batch(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    out = {"input_ids": torch.full((len(examples), width), pad_id), "labels": torch.full((len(examples), width), IGNORE),
           "attention_mask": torch.zeros((len(examples), width), dtype=torch.long)}
    for row, (ids, labels) in enumerate(examples):
        out["input_ids"][row, : len(ids)] = torch.tensor(ids)
        out["labels"][row, : len(ids)] = torch.tensor(labels)
        out["attention_mask"][row, : len(ids)] = 1
    return out


def evaluate(model_dir: str, task: ClarifyTask, prompts: int = 300) -> tuple[float, float]:
    """Greedy held-out episodes (up to 3 rounds): mean return and accuracy."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = load_policy(model_dir, 4, 8, 0.0, "all-linear")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    returns, correct = greedy_episodes(task, engine, tokenizer, list(task.heldout_records())[:prompts], 3, spec)
    return returns.mean().item(), correct.float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(REPO_ROOT / "data" / "tiny-llama"))
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "data" / "tiny-llama-clarify")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(args.source)
    model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.float32)
    task = ClarifyTask()
    rng = random.Random(args.seed)
    train = list(task.train_records())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    for _ in range(args.steps):
        examples = [protocol_example(tokenizer, record, rng) for record in rng.sample(train, args.batch_size)]
        loss = model(**batch(examples, tokenizer.pad_token_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    mean_return, accuracy = evaluate(str(args.output), task)
    source = Path(args.source).resolve()
    shown = source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source
    lines = [f"fine-tuned from {shown} for {args.steps} steps (batch {args.batch_size}, lr {args.lr}, seed "
             f"{args.seed}) on the clarification game's training split",
             f"greedy held-out episodes (300 prompts, <= 3 rounds): mean return {mean_return:.3f}, accuracy {accuracy:.3f}",
             f"wall time: {time.time() - started:.0f} s"]
    (args.output / "BUILD.md").write_text(
        "# tiny-llama-clarify\n\nThe shipped tiny model taught the clarification game's protocol (ask or answer, "
        "with no preference for when).\n\nRebuilt by:\n\n    .venv/bin/python scripts/build_clarify_model.py\n\n"
        + "\n".join(f"- {line}" for line in lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
