"""Build the warm-start models of the multi-round games: ``data/tiny-llama-clarify`` (``--game clarify``),
``data/tiny-llama-hidden`` (``--game hidden-operands``) and ``data/tiny-llama-calculator`` (``--game calculator``),
each taught its game's protocol but not its policy.

Fine-tunes ``data/tiny-llama`` by teacher forcing on the game's *training* split only. At every round of every
prompt the demonstration asks (``?``, then the environment's reply) or answers with equal odds; the answer is the
right sum where the state allows it (every operand known; at most two operands left to add) and a guess elsewhere
(``demonstrated_answer``). So the model knows how to ask and how to answer but has no preference for when: that is
what GRPO or tree-relative training must learn. Prints held-out greedy figures, among them the informed accuracy
(the answer after the oracle's questions), which says whether asking can pay at all.

Usage: ``.venv/bin/python scripts/build_clarify_model.py --game hidden-operands`` (deterministic; the game's
recipe in ``RECIPES``; about 10 minutes for the three-round games on 2 cores).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.tasks import ClarifyTask  # noqa: E402
from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask, reduced  # noqa: E402
from lit_grpo.rollout.trees import greedy_episodes  # noqa: E402

IGNORE = -100
GAMES = {"clarify": ClarifyTask, "hidden-operands": HiddenOperandsTask, "calculator": CalculatorTask}
NAMES = {"clarify": "tiny-llama-clarify", "hidden-operands": "tiny-llama-hidden", "calculator": "tiny-llama-calculator"}
ROUNDS = {ClarifyTask: 2, HiddenOperandsTask: 3, CalculatorTask: 3}  # the rounds a demonstration may take
# (steps, lr): the three-round games need their addition learnt well enough that asking pays (informed accuracy)
RECIPES = {"clarify": (150, 5e-4), "hidden-operands": (1000, 1e-3), "calculator": (1000, 1e-3)}


def demonstrated_answer(task, record: dict, questions: int, rng: random.Random) -> int:
    """The answer the demonstration gives after ``questions`` questions: the right sum when the state allows it
    (every operand known; at most two operands left to add), else a guess (a random value for each unknown
    operand; a sum of three or more operands off by 1 to 9)."""
    if isinstance(task, CalculatorTask):
        exact = len(reduced(record["operands"], questions)) <= 2
        return int(record["answer"]) + (0 if exact else rng.choice([-1, 1]) * rng.randint(1, 9))
    hidden = record["hidden"] if isinstance(record["hidden"], list) else (["b"] if record["hidden"] else [])
    return int(record["answer"]) + sum(rng.randint(10, 99) - record[name] for name in hidden[questions:])


def protocol_example(tokenizer, task, record: dict, rng: random.Random) -> tuple[list[int], list[int]]:
    """Token ids and labels of one episode in which every round asks or answers with equal odds (the last round
    answers, with ``demonstrated_answer``); the prompt and the environment's replies carry no label."""
    eos = tokenizer.eos_token_id
    ids = tokenizer(record["prompt"])["input_ids"]
    labels = [IGNORE] * len(ids)

    def say(text: str, learn: bool) -> None:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos] if learn else [])
        ids.extend(piece)
        labels.extend(piece if learn else [IGNORE] * len(piece))

    rounds = ROUNDS[type(task)]
    for round_index in range(1, rounds + 1):
        if round_index < rounds and rng.random() < 0.5:
            say("?", learn=True)
            say(task.step(record, round_index, "?").reply, learn=False)
            continue
        say(str(demonstrated_answer(task, record, round_index - 1, rng)), learn=True)
        break
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


def evaluate(model_dir: str, task, prompts: int = 300) -> tuple[float, float, float]:
    """Greedy held-out episodes (up to 3 rounds): mean return and accuracy; and the informed accuracy, of the
    greedy answer after the oracle's questions (how well the model adds once asking has paid)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = load_policy(model_dir, 4, 8, 0.0, "all-linear")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    records = list(task.heldout_records())[:prompts]
    returns, correct = greedy_episodes(task, engine, tokenizer, records, 3, spec)
    contexts = []
    for record in records:
        ids = task.prompt_ids(record, tokenizer)
        for question in range(1, task.oracle_questions(record) + 1):
            ids += tokenizer("?", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids += tokenizer(task.reply(record, question), add_special_tokens=False)["input_ids"]
        contexts.append(ids)
    answers = engine.generate(contexts, 1, replace(spec, greedy=True))
    informed = [tokenizer.decode(list(a[0].token_ids), skip_special_tokens=True).strip() == r["answer"]
                for a, r in zip(answers, records)]
    return returns.mean().item(), correct.float().mean().item(), sum(informed) / len(informed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(REPO_ROOT / "data" / "tiny-llama"))
    parser.add_argument("--game", choices=sorted(GAMES), default="clarify")
    parser.add_argument("--output", type=Path, default=None, help="default: data/tiny-llama-clarify, -hidden or -calculator")
    parser.add_argument("--steps", type=int, default=None, help="default: the game's recipe (RECIPES)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: the game's recipe (RECIPES)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.steps = args.steps or RECIPES[args.game][0]
    args.lr = args.lr or RECIPES[args.game][1]
    started = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(args.source)
    model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.float32)
    task = GAMES[args.game]()
    name = NAMES[args.game]
    args.output = args.output or REPO_ROOT / "data" / name
    rng = random.Random(args.seed)
    train = list(task.train_records())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    for _ in range(args.steps):
        examples = [protocol_example(tokenizer, task, record, rng) for record in rng.sample(train, args.batch_size)]
        loss = model(**batch(examples, tokenizer.pad_token_id)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    args.output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    mean_return, accuracy, informed = evaluate(str(args.output), task)
    source = Path(args.source).resolve()
    shown = source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source
    lines = [f"fine-tuned from {shown} for {args.steps} steps (batch {args.batch_size}, lr {args.lr}, seed "
             f"{args.seed}) on the {type(task).__name__} game's training split",
             f"greedy held-out episodes (300 prompts, <= 3 rounds): mean return {mean_return:.3f}, accuracy {accuracy:.3f}",
             f"greedy answer after the oracle's questions (informed accuracy): {informed:.3f}",
             f"wall time: {time.time() - started:.0f} s"]
    (args.output / "BUILD.md").write_text(
        f"# {name}\n\nThe shipped tiny model taught the {type(task).__name__} game's protocol (ask or answer, "
        f"with no preference for when).\n\nRebuilt by:\n\n    .venv/bin/python scripts/build_clarify_model.py "
        f"--game {args.game}\n\n"
        + "\n".join(f"- {line}" for line in lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
