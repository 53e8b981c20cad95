"""Build the warm-start models of the multi-round games: ``data/tiny-llama-clarify`` (``--game clarify``),
``data/tiny-llama-hidden`` (``--game hidden-operands``), ``data/tiny-llama-calculator`` (``--game calculator``) and
``data/tiny-llama-stale`` (``--game stale-digits``), each taught its game's protocol but not its policy.

Fine-tunes ``data/tiny-llama`` by teacher forcing on the game's *training* split only. At every round of every
prompt the demonstration asks (``?``, then the environment's reply) or answers with equal odds; the answer is the
right sum where the state allows it (every operand known; at most two operands left to add) and a guess elsewhere
(``demonstrated_answer``). So the model knows how to ask and how to answer but has no preference for when: that is
what GRPO or tree-relative training must learn. Prints held-out greedy figures, among them the informed accuracy
(the answer after the oracle's questions), which says whether asking can pay at all.

For the stale-digits game (issue 35) it also prints the three figures its warm start must meet before any RL:
the informed accuracy (every stale digit revealed), how often the greedy first decision (ask or answer) agrees with
the oracle's, and how many questions the oracle asks across prompts.

Usage: ``.venv/bin/python scripts/build_clarify_model.py --game hidden-operands`` (deterministic; the game's
recipe in ``RECIPES``; about 10 minutes for the three-round games on 2 cores); ``--evaluate-only`` measures the
model already built.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
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
from lit_grpo.tasks.games.stale_digits import NAMES as STALE_NAMES  # noqa: E402
from lit_grpo.tasks.games.stale_digits import StaleDigitsTask  # noqa: E402
from lit_grpo.rollout.trees import greedy_trees  # noqa: E402
from lit_grpo.tree import chain_returns, depth_first  # noqa: E402

IGNORE = -100
GAMES = {"clarify": ClarifyTask, "hidden-operands": HiddenOperandsTask, "calculator": CalculatorTask,
         "stale-digits": StaleDigitsTask}
NAMES = {"clarify": "tiny-llama-clarify", "hidden-operands": "tiny-llama-hidden", "calculator": "tiny-llama-calculator",
         "stale-digits": "tiny-llama-stale"}
# the rounds a demonstration may take (and a greedy evaluation)
ROUNDS = {ClarifyTask: 2, HiddenOperandsTask: 3, CalculatorTask: 3, StaleDigitsTask: 4}
# (steps, lr): the three-round games need their addition learnt well enough that asking pays (informed accuracy)
RECIPES = {"clarify": (150, 5e-4), "hidden-operands": (1000, 1e-3), "calculator": (1000, 1e-3),
           "stale-digits": (1500, 1e-3)}


def demonstrated_answer(task, record: dict, questions: int, rng: random.Random) -> int:
    """The answer the demonstration gives after ``questions`` questions: the right sum when the state allows it
    (every operand known; at most two operands left to add), else a guess (a random value for each unknown
    operand; a sum of three or more operands off by 1 to 9). In the stale-digits game: the code as far as it is known,
    the shown digits with the revealed ones put in (right iff every stale digit was revealed)."""
    if isinstance(task, StaleDigitsTask):
        unrevealed = record["stale"][questions:]
        return int("".join(str(record["shown"][i] if name in unrevealed else record["digits"][i])
                           for i, name in enumerate(STALE_NAMES)))
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


def evaluate(model_dir: str, task, prompts: int = 300) -> dict[str, float | str]:
    """Greedy held-out episodes (the game's rounds): mean return and accuracy; the informed accuracy, of the
    greedy answer (its first token forced to a digit) after the questions that reveal everything hidden (how well
    the model answers once asking has paid); how often the greedy first decision (ask or answer) is the oracle's; the oracle's questions per prompt."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    policy = load_policy(model_dir, 4, 8, 0.0, "all-linear")
    engine = HFEngine()
    engine.push_policy(policy)
    spec = SamplingSpec(max_new_tokens=6, stop_token_ids=(tokenizer.eos_token_id,))
    records = list(task.heldout_records())[:prompts]
    roots = greedy_trees(task, engine, tokenizer, records, ROUNDS[type(task)], spec)
    returns = [chain_returns(root)[0] for root in roots]
    correct = [bool(getattr(depth_first(root)[-1], "correct", False)) for root in roots]
    oracle = [task.oracle_questions(r) for r in records]
    agrees = [(root.children[0].kind == "ask") == (asked > 0) for root, asked in zip(roots, oracle)]
    contexts = []
    for record in records:
        ids = task.prompt_ids(record, tokenizer)
        for question in range(1, task.informed_questions(record) + 1):
            ids += tokenizer("?", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            ids += tokenizer(task.reply(record, question), add_special_tokens=False)["input_ids"]
        contexts.append(ids)
    digits = tuple(task.answer_token_ids(tokenizer))  # an answer, not a question: the skill is measured
    answers = engine.generate(contexts, 1, replace(spec, greedy=True, allowed_token_ids=(digits,) * len(contexts)))
    informed = [tokenizer.decode(list(a[0].token_ids), skip_special_tokens=True).strip() == r["answer"]
                for a, r in zip(answers, records)]
    counts = Counter(oracle)
    return {"prompts": len(records), "return": statistics.fmean(returns), "accuracy": statistics.fmean(correct),
            "informed": statistics.fmean(informed), "agreement": statistics.fmean(agrees),
            "oracle_questions": ", ".join(f"{k}: {counts[k]}" for k in sorted(counts)),
            "oracle_return": task.oracle_return(records)}


def report_lines(figures: dict[str, float | str], rounds: int) -> list[str]:
    return [f"greedy held-out episodes ({figures['prompts']} prompts, <= {rounds} rounds): mean return "
            f"{figures['return']:.3f}, accuracy {figures['accuracy']:.3f} (the oracle's return "
            f"{figures['oracle_return']:.3f})",
            f"greedy answer once everything hidden is revealed (informed accuracy): {figures['informed']:.3f}",
            f"greedy first decision (ask or answer) agrees with the oracle's on {figures['agreement']:.3f} of prompts",
            f"the oracle's questions per prompt (count: prompts): {figures['oracle_questions']}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(REPO_ROOT / "data" / "tiny-llama"))
    parser.add_argument("--game", choices=sorted(GAMES), default="clarify")
    parser.add_argument("--output", type=Path, default=None, help="default: data/tiny-llama-clarify, -hidden or -calculator")
    parser.add_argument("--steps", type=int, default=None, help="default: the game's recipe (RECIPES)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: the game's recipe (RECIPES)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout", type=int, default=None, help="held-out prompts to measure on (default 300; "
                        "500 for stale-digits, its whole held-out split)")
    parser.add_argument("--evaluate-only", action="store_true", help="measure the model at --output, train nothing")
    args = parser.parse_args()
    args.steps = args.steps or RECIPES[args.game][0]
    args.lr = args.lr or RECIPES[args.game][1]
    args.heldout = args.heldout or (500 if args.game == "stale-digits" else 300)
    started = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    tokenizer = AutoTokenizer.from_pretrained(args.source)
    model = AutoModelForCausalLM.from_pretrained(args.source, dtype=torch.float32)
    task = GAMES[args.game]()
    name = NAMES[args.game]
    args.output = args.output or REPO_ROOT / "data" / name
    if args.evaluate_only:
        print("\n".join(report_lines(evaluate(str(args.output), task, args.heldout), ROUNDS[type(task)])))
        return
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
    figures = evaluate(str(args.output), task, args.heldout)
    source = Path(args.source).resolve()
    shown = source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source
    lines = [f"fine-tuned from {shown} for {args.steps} steps (batch {args.batch_size}, lr {args.lr}, seed "
             f"{args.seed}) on the {type(task).__name__} game's training split",
             *report_lines(figures, ROUNDS[type(task)]),
             f"wall time: {time.time() - started:.0f} s"]
    (args.output / "BUILD.md").write_text(
        f"# {name}\n\nThe shipped tiny model taught the {type(task).__name__} game's protocol (ask or answer, "
        f"with no preference for when).\n\nRebuilt by:\n\n    .venv/bin/python scripts/build_clarify_model.py "
        f"--game {args.game}\n\n"
        + "\n".join(f"- {line}" for line in lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
