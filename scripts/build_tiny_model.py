"""Build the project's embedded default model: a tiny character-level Llama, warm-started offline.

Why it exists: the quickstart and the tests need a policy that is small enough for two CPU cores, loads without
any download, and is *partly* competent at the built-in arithmetic task, so that a short GRPO run has room to
improve it (held-out greedy accuracy well below 100%) and gets non-flat reward groups (accuracy well above 0%).

The warm-start is plain teacher forcing on the *training* splits of the arithmetic and sort tasks only; the
held-out splits are used solely for the final report. Everything is seeded and runs on a fixed thread count, so
rerunning the script on the same machine reproduces the same weights and figures.

Usage: ``.venv/bin/python scripts/build_tiny_model.py`` (writes ``data/tiny-llama/``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without requiring an editable install

from lit_grpo.tasks import ArithmeticTask, SortTask  # noqa: E402
from lit_grpo.tasks.base import PromptRecord  # noqa: E402
from tiny_models import build_char_tokenizer, tiny_llama_config  # noqa: E402  (scripts/, this script's folder)

IGNORE_INDEX = -100
ACCURACY_BAND = (0.20, 0.50)
BUILD_COMMAND = ".venv/bin/python scripts/build_tiny_model.py"
Example = tuple[list[int], list[int]]


@dataclass(frozen=True)
class Report:
    """The figures printed at the end and written to BUILD.md."""

    parameters: int
    arithmetic_accuracy: float
    sort_accuracy: float
    eos_rate: float
    mixed_group_fraction: float
    sampled_accuracy: float
    seconds: float

    def lines(self, args: argparse.Namespace) -> list[str]:
        return [
            f"parameters: {self.parameters:,}",
            f"warm-start: {args.steps} steps, batch {args.batch_size}, lr {args.lr}, seed {args.seed}",
            f"arithmetic held-out greedy accuracy (1000 prompts): {self.arithmetic_accuracy:.3f}",
            f"sort held-out greedy accuracy ({args.sort_heldout} prompts): {self.sort_accuracy:.3f}",
            f"arithmetic greedy completions ending with </s> within 6 tokens: {self.eos_rate:.3f}",
            f"T=1 sampling, {args.group_size} per prompt on {args.group_prompts} held-out prompts: "
            f"mixed-group fraction {self.mixed_group_fraction:.3f}, sample accuracy {self.sampled_accuracy:.3f}",
            f"wall time: {self.seconds:.0f} s",
        ]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """CLI flags; the defaults are the ones that built the committed model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "data" / "tiny-llama")
    parser.add_argument("--steps", type=int, default=240, help="warm-start optimiser steps")
    parser.add_argument("--batch-size", type=int, default=64, help="sequences per step, half of each task")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW peak learning rate")
    parser.add_argument("--warmup", type=int, default=50, help="linear warm-up steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sort-heldout", type=int, default=500, help="held-out sort prompts to evaluate")
    parser.add_argument("--group-prompts", type=int, default=100, help="held-out prompts for the T=1 check")
    parser.add_argument("--group-size", type=int, default=8, help="samples per prompt for the T=1 check")
    parser.add_argument("--trace-every", type=int, default=0, help="print held-out accuracy every N steps (0: off)")
    parser.add_argument("--no-save", action="store_true", help="evaluate only, write nothing")
    return parser.parse_args(argv)


def seed_everything(seed: int) -> None:
    """One seed for every RNG the build touches; fixed threads because CPU reductions depend on the split."""
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)


def encode_examples(tokenizer: PreTrainedTokenizerFast, records: Sequence[PromptRecord]) -> list[Example]:
    """``<s>{prompt}{answer}</s>`` with labels only on the answer and EOS: the model must not learn the prompts."""
    examples: list[Example] = []
    for record in records:
        prompt_ids = tokenizer(record["prompt"])["input_ids"]
        full_ids = tokenizer(record["prompt"] + record["answer"])["input_ids"] + [tokenizer.eos_token_id]
        if full_ids[: len(prompt_ids)] != prompt_ids:
            raise ValueError(f"prompt {record['prompt']!r} does not tokenise as a prefix of its example")
        labels = [IGNORE_INDEX] * len(prompt_ids) + full_ids[len(prompt_ids) :]
        examples.append((full_ids, labels))
    return examples


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest example; padded positions are masked out of attention and loss."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, example_labels) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(example_labels)
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def sample_batch(rng: random.Random, pools: Sequence[Sequence[Example]], batch_size: int) -> list[Example]:
    """An equal share of each task per step, so neither task's accuracy depends on sampling luck."""
    share = batch_size // len(pools)
    return [example for pool in pools for example in rng.sample(pool, share)]


def learning_rate(step: int, peak: float, warmup: int) -> float:
    """Linear warm-up then constant: the model after N steps is the same whatever the total, so a trace of one
    run tells what any shorter ``--steps`` would have produced."""
    return peak * min(1.0, (step + 1) / max(1, warmup))


def warm_start(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> None:
    """Teacher-forced fine-tuning on the two tasks' training splits (never their held-out splits)."""
    pools = [
        encode_examples(tokenizer, ArithmeticTask().train_records()),
        encode_examples(tokenizer, SortTask().train_records()),
    ]
    rng = random.Random(args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.lr, args.warmup)
        batch = collate(sample_batch(rng, pools, args.batch_size), tokenizer.pad_token_id)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.trace_every and (step + 1) % args.trace_every == 0:
            accuracy, _ = greedy_accuracy(model, tokenizer, ArithmeticTask().heldout_records(), 6)
            print(f"step {step + 1:5d}  loss {loss.item():.4f}  arithmetic held-out greedy {accuracy:.3f}", flush=True)
            model.train()


def left_pad(prompts: Sequence[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding so every prompt ends at the same column and generation continues from its last token."""
    width = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    return input_ids, attention_mask


@torch.no_grad()
def complete(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    prompts: Sequence[str],
    max_new_tokens: int,
    sample: bool = False,
    batch_size: int = 250,
) -> list[tuple[str, bool]]:
    """Decoded completion and whether it emitted EOS, for each prompt; sampling is plain T=1 when ``sample``."""
    model.eval()
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    results: list[tuple[str, bool]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [tokenizer(text)["input_ids"] for text in prompts[start : start + batch_size]]
        input_ids, attention_mask = left_pad(chunk, tokenizer.pad_token_id)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **sampling,
        )
        for new_tokens in output[:, input_ids.shape[1] :].tolist():
            text = tokenizer.decode(new_tokens, skip_special_tokens=True).strip()
            results.append((text, tokenizer.eos_token_id in new_tokens))
    return results


def greedy_accuracy(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, records: Sequence[PromptRecord], max_new_tokens: int
) -> tuple[float, float]:
    """Exact-match accuracy and EOS rate of greedy completions, scored as the tasks score them."""
    completions = complete(model, tokenizer, [record["prompt"] for record in records], max_new_tokens)
    correct = sum(text == str(record["answer"]).strip() for (text, _), record in zip(completions, records))
    ended = sum(has_eos for _, has_eos in completions)
    return correct / len(records), ended / len(records)


def group_statistics(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, records: Sequence[PromptRecord], group_size: int
) -> tuple[float, float]:
    """Share of T=1 groups with both right and wrong samples (the ones GRPO learns from), and sample accuracy."""
    prompts = [record["prompt"] for record in records for _ in range(group_size)]
    completions = complete(model, tokenizer, prompts, max_new_tokens=6, sample=True)
    mixed = 0
    total_correct = 0
    for index, record in enumerate(records):
        group = completions[index * group_size : (index + 1) * group_size]
        correct = sum(text == str(record["answer"]).strip() for text, _ in group)
        mixed += 0 < correct < group_size
        total_correct += correct
    return mixed / len(records), total_correct / len(prompts)


def evaluate(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace, started: float
) -> Report:
    """The held-out figures; sampling is reseeded so the T=1 check does not depend on what ran before."""
    arithmetic = ArithmeticTask().heldout_records()
    arithmetic_accuracy, eos_rate = greedy_accuracy(model, tokenizer, arithmetic, max_new_tokens=6)
    sort_records = list(SortTask().heldout_records())[: args.sort_heldout]
    # the longest sorted answer ("0,1,2,3,4") is 9 characters: 6 new tokens would cap sort accuracy at 3-item lists
    sort_tokens = max(len(record["answer"]) for record in sort_records) + 1
    sort_accuracy, _ = greedy_accuracy(model, tokenizer, sort_records, max_new_tokens=sort_tokens)
    torch.manual_seed(args.seed)
    mixed, sampled = group_statistics(model, tokenizer, list(arithmetic)[: args.group_prompts], args.group_size)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return Report(parameters, arithmetic_accuracy, sort_accuracy, eos_rate, mixed, sampled, time.time() - started)


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, report: Report, args: argparse.Namespace) -> None:
    """Weights (safetensors, fp32), tokenizer and a BUILD.md recording how they were made and what they score."""
    args.output.mkdir(parents=True, exist_ok=True)
    generation = model.generation_config
    generation.bos_token_id, generation.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    # transformers refuses to save top_k=0 beside do_sample=False; lit-grpo's engines set top-k off explicitly
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    body = "\n".join(f"- {line}" for line in report.lines(args))
    (args.output / "BUILD.md").write_text(
        "# tiny-llama\n\n"
        "A character-level Llama, randomly initialised and warm-started by teacher forcing on the training splits\n"
        "of the built-in arithmetic and sort tasks (never their held-out splits), so that GRPO has room to improve it.\n\n"
        f"Rebuilt, offline and deterministically (2 CPU threads), by:\n\n    {BUILD_COMMAND}\n\n"
        f"Figures printed by that build:\n\n{body}\n",
        encoding="utf-8",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Build, warm-start, evaluate, save; non-zero exit when arithmetic accuracy leaves the band GRPO needs."""
    args = parse_args(argv)
    started = time.time()
    seed_everything(args.seed)
    tokenizer = build_char_tokenizer()
    config = tiny_llama_config(vocab_size=len(tokenizer))
    model = LlamaForCausalLM(config).to(torch.float32)
    warm_start(model, tokenizer, args)
    report = evaluate(model, tokenizer, args, started)
    for line in report.lines(args):
        print(line)
    low, high = ACCURACY_BAND
    if not low <= report.arithmetic_accuracy <= high:
        print(f"arithmetic accuracy {report.arithmetic_accuracy:.3f} is outside [{low}, {high}]", file=sys.stderr)
        return 1
    if not args.no_save:
        save(model, tokenizer, report, args)
        print(f"saved to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
