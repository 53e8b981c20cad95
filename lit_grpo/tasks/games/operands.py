"""The operand games: two-digit addition ``a+b`` with operands hidden behind ``?``, revealed by asking."""

from __future__ import annotations

import random
from abc import abstractmethod

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask, reordered
from lit_grpo.tasks.splits import halves

HIDDEN = ("a", "b")  # the operands that may be hidden, revealed in this order


class OperandGame(AskOrAnswerTask):
    """What the operand games share: every two-digit pair ``(a, b)`` once, shuffled by ``split_seed``; each pair's
    record draws what it hides from the same generator (``pair_record``); the first ``heldout_size`` are held out,
    their first half validating and the rest testing (``halves``), and the rest train, in the order
    ``train_order_seed`` gives (``reordered``). ``hidden``: the chance each record draws its hidden operands with,
    named ``hidden_name`` in the game's own arguments."""

    def __init__(self, hidden: float, hidden_name: str, correct_reward: float, wrong_reward: float, ask_cost: float,
                 malformed_reward: float, no_answer_reward: float, heldout_size: int, split_seed: int,
                 train_order_seed: int | None, use_chat_template: bool, max_rounds: int) -> None:
        if not 0 <= hidden <= 1:
            raise InputError(f"{type(self).__name__}: {hidden_name} must be in [0, 1], got {hidden}")
        super().__init__(correct_reward, wrong_reward, ask_cost, malformed_reward, no_answer_reward, heldout_size,
                         split_seed, use_chat_template, max_rounds)
        self.hidden_share, self.train_order_seed = hidden, train_order_seed

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """Every operand pair, shuffled; the first ``heldout_size`` held out, their first half validating and the
        rest testing (``halves``); the rest train."""
        rng = random.Random(self.split_seed)
        pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        rng.shuffle(pairs)
        records = [self.pair_record(a, b, rng) for a, b in pairs]
        return (reordered(records[self.heldout_size:], self.train_order_seed), *halves(records[: self.heldout_size]))

    @abstractmethod
    def pair_record(self, a: int, b: int, rng: random.Random) -> PromptRecord:
        """The record of the pair ``(a, b)``, what it hides drawn from ``rng`` (the split's own generator)."""


class ClarifyTask(OperandGame):
    """A clarification game over two-digit addition: asking costs a little, answering wrong costs a lot.

    Each prompt is ``"{a}+{b}="`` or, with probability ``hidden_fraction``, ``"{a}+?="`` with b hidden. A segment
    ``"?"`` asks: it costs ``ask_cost`` and the environment replies ``"b={b};"``. A segment of digits answers:
    ``correct_reward`` if it is a + b, else ``wrong_reward``. Anything else is malformed. So asking pays on hidden
    prompts (a guess at b is almost surely wrong) and wastes ``ask_cost`` on the others: when to stop is learnable,
    and an informed answer is plain addition.

    Args:
        hidden_fraction: share of prompts whose b is hidden.
        correct_reward: reward of a right answer.
        wrong_reward: reward of a wrong answer.
        ask_cost: cost of one question (its reward is ``-ask_cost``).
        malformed_reward: reward of a segment that is neither an answer nor ``?``.
        no_answer_reward: reward of an episode closed at ``max_depth`` without an answer.
        heldout_size: held-out prompts, disjoint (by operand pair) from the training ones: half validation, half
            test.
        split_seed: seed of the split, of which prompts hide b, and of the training order.
        use_chat_template: see ``Task``.
        max_rounds: rounds an episode runs at most (one question is all a prompt needs; a third round lets a
            policy that asked twice still answer); a tree's ``data.branching`` names one width per round.
    """

    def __init__(
        self,
        hidden_fraction: float = 0.5,
        correct_reward: float = 1.0,
        wrong_reward: float = -1.0,
        ask_cost: float = 0.1,
        malformed_reward: float = -1.0,
        no_answer_reward: float = -0.5,
        heldout_size: int = 1000,
        split_seed: int = 0,
        use_chat_template: bool = False,
        max_rounds: int = 3,
    ) -> None:
        super().__init__(hidden_fraction, "hidden_fraction", correct_reward, wrong_reward, ask_cost, malformed_reward,
                         no_answer_reward, heldout_size, split_seed, None, use_chat_template, max_rounds)
        self.hidden_fraction = hidden_fraction

    def pair_record(self, a: int, b: int, rng: random.Random) -> PromptRecord:
        """b hidden with probability ``hidden_fraction``."""
        return self.record(a, b, rng.random() < self.hidden_fraction)

    @staticmethod
    def record(a: int, b: int, hidden: bool) -> PromptRecord:
        prompt = f"{a}+?=" if hidden else f"{a}+{b}="
        return {"prompt": prompt, "answer": str(a + b), "a": a, "b": b, "hidden": hidden}

    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        return f"b={prompt_record['b']};"

    @staticmethod
    def oracle_questions(record: PromptRecord) -> int:
        """The oracle's questions on ``record``: one if b is hidden."""
        return int(record["hidden"])


class HiddenOperandsTask(OperandGame):
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
        hidden_probability: probability that each of a and b is hidden.
        correct_reward: reward of a right answer.
        wrong_reward: reward of a wrong answer.
        ask_cost: cost of one question (its reward is ``-ask_cost``).
        malformed_reward: reward of a segment that is neither an answer nor ``?``.
        no_answer_reward: reward of an episode closed at ``max_depth`` without an answer.
        heldout_size: held-out prompts, disjoint (by operand pair) from the training ones: half validation, half
            test.
        split_seed: seed of the split, of which operands are hidden, and of the training order.
        train_order_seed: when set, the training prompts are shuffled with this seed (same prompts, another order);
            ``None`` keeps the split's order.
        use_chat_template: see ``Task``.
        max_rounds: rounds an episode runs at most (two hidden operands need two questions, and a third round answers);
            a tree's ``data.branching`` names one width per round.
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
        train_order_seed: int | None = None,
        use_chat_template: bool = False,
        max_rounds: int = 3,
    ) -> None:
        super().__init__(hidden_probability, "hidden_probability", correct_reward, wrong_reward, ask_cost,
                         malformed_reward, no_answer_reward, heldout_size, split_seed, train_order_seed,
                         use_chat_template, max_rounds)
        self.hidden_probability = hidden_probability

    def pair_record(self, a: int, b: int, rng: random.Random) -> PromptRecord:
        """Each of a and b hidden with probability ``hidden_probability``, a first."""
        return self.record(a, b, [n for n in HIDDEN if rng.random() < self.hidden_probability])

    @staticmethod
    def record(a: int, b: int, hidden: list[str]) -> PromptRecord:
        shown = {"a": a, "b": b}
        prompt = "+".join("?" if n in hidden else str(shown[n]) for n in HIDDEN) + "="
        return {"prompt": prompt, "answer": str(a + b), "a": a, "b": b, "hidden": list(hidden)}

    @staticmethod
    def oracle_questions(record: PromptRecord) -> int:
        """The oracle's questions on ``record``: one per hidden operand."""
        return len(record["hidden"])

    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        """Every segment before round ``round_index`` of a running episode was a question (an answer ends it), so
        this question is the ``round_index``-th and reveals the ``round_index``-th hidden operand."""
        hidden = prompt_record["hidden"]
        name = hidden[round_index - 1] if round_index <= len(hidden) else None
        return f"{name}={prompt_record[name]};" if name else "none;"
