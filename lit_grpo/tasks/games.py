"""Multi-round games where several rounds each carry a decision that matters (issue 20)."""

from __future__ import annotations

import random

from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.multiround import AskOrAnswerTask

HIDDEN = ("a", "b")  # the operands that may be hidden, revealed in this order


class HiddenOperandsTask(AskOrAnswerTask):
    """Two-digit addition ``a+b`` with each operand hidden (``?``) with probability ``hidden_probability``, so 0, 1
    or 2 operands are unknown (the base model's addition skill carries over; only the questions are new).

    A segment ``?`` asks: it costs ``ask_cost`` and reveals the next hidden operand (``a=47;``, then ``b=12;``), or
    ``none;`` when nothing is hidden any more. A segment of digits answers: ``correct_reward`` if it is a + b, else
    ``wrong_reward``. A hidden operand guessed is right one time in ninety, so the right number of questions is the
    number of hidden operands, which depends on the prompt and changes from round to round: episodes run up to 3
    rounds and their returns take several values (1, 0.9, 0.8 and -1, -1.1, ... with the defaults).

    Oracle policy: ask exactly as many times as operands are hidden, then answer right; its return is
    ``correct_reward - ask_cost * hidden``, on average ``correct_reward - ask_cost * 2 * hidden_probability``
    (``oracle_return`` gives it on any set of prompts).

    Args:
        hidden_probability: probability that each of b and c is hidden.
        correct_reward: reward of a right answer.
        wrong_reward: reward of a wrong answer.
        ask_cost: cost of one question (its reward is ``-ask_cost``).
        malformed_reward: reward of a segment that is neither an answer nor ``?``.
        no_answer_reward: reward of an episode closed at ``max_depth`` without an answer.
        heldout_size: held-out prompts, disjoint (by operand pair) from the training ones.
        split_seed: seed of the split, of which operands are hidden, and of the training order.
        use_chat_template: see ``Task``.
    """

    def __init__(
        self,
        hidden_probability: float = 0.5,
        correct_reward: float = 1.0,
        wrong_reward: float = -1.0,
        ask_cost: float = 0.1,
        malformed_reward: float = -1.0,
        no_answer_reward: float = -0.5,
        heldout_size: int = 500,
        split_seed: int = 0,
        use_chat_template: bool = False,
    ) -> None:
        if not 0 <= hidden_probability <= 1:
            raise ValueError(f"hidden_probability must be in [0, 1], got {hidden_probability}")
        super().__init__(correct_reward, wrong_reward, ask_cost, malformed_reward, no_answer_reward, heldout_size,
                         split_seed, use_chat_template)
        self.hidden_probability = hidden_probability

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord]]:
        rng = random.Random(self.split_seed)
        pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        rng.shuffle(pairs)
        records = [self.record(a, b, [n for n in HIDDEN if rng.random() < self.hidden_probability]) for a, b in pairs]
        return records[self.heldout_size:], records[: self.heldout_size]

    @staticmethod
    def record(a: int, b: int, hidden: list[str]) -> PromptRecord:
        shown = {"a": a, "b": b}
        prompt = "+".join("?" if n in hidden else str(shown[n]) for n in HIDDEN) + "="
        return {"prompt": prompt, "answer": str(a + b), "a": a, "b": b, "hidden": list(hidden)}

    def oracle_return(self, records: list[PromptRecord]) -> float:
        """The oracle's mean return on ``records``: as many questions as hidden operands, then the right sum."""
        return sum(self.correct_reward - self.ask_cost * len(r["hidden"]) for r in records) / len(records)

    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        """Every segment before round ``round_index`` of a running episode was a question (an answer ends it), so
        this question is the ``round_index``-th and reveals the ``round_index``-th hidden operand."""
        hidden = prompt_record["hidden"]
        name = hidden[round_index - 1] if round_index <= len(hidden) else None
        return f"{name}={prompt_record[name]};" if name else "none;"
