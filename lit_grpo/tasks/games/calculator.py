"""A calculator game: sums of several operands, where calling the calculator pays when more than two remain."""

from __future__ import annotations

import random

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask, reordered
from lit_grpo.tasks.splits import halves


class CalculatorTask(AskOrAnswerTask):
    """Sums of 2, 3 or 4 operands (``12+25+17=``) with a calculator: a segment ``?`` calls it (cost ``ask_cost``)
    and the environment replies with the expression whose first two operands are replaced by their sum
    (``37+17=``; a single number stays as it is). A segment of digits answers the whole sum.

    The calculator is exact; the policy's own arithmetic is good at two operands only (the warm start is taught to
    add two, and answers longer sums with a rough estimate). So a question pays when more than two operands
    remain, and with four operands a call at round 1 pays off only through a second call at round 2 and the
    answer at round 3. Operands lie in 10..30, so every sum the policy adds is of two numbers below 100.

    Oracle policy: call until two operands remain (``operands - 2`` calls), then add them; its return is
    ``correct_reward - ask_cost * (operands - 2)`` (``oracle_return``). A policy whose own two-operand addition is
    unsure may call once more (the reply is then the answer itself): worth it while its accuracy is below
    ``1 - ask_cost / (correct_reward - wrong_reward)``.

    Args:
        operand_counts: the operand counts of the prompts, each with an equal share (each in 2..4).
        correct_reward: reward of a right answer.
        wrong_reward: reward of a wrong answer.
        ask_cost: cost of one calculator call (its reward is ``-ask_cost``).
        malformed_reward: reward of a segment that is neither an answer nor ``?``.
        no_answer_reward: reward of an episode closed at ``max_depth`` without an answer.
        heldout_size: held-out prompts, disjoint (by operand tuple) from the training ones: half validation, half
            test.
        split_seed: seed of the prompts, the split and the training order.
        train_order_seed: when set, the training prompts are shuffled with this seed (same prompts, another order);
            ``None`` keeps the split's order.
        use_chat_template: see ``Task``.
        max_rounds: rounds an episode runs at most (two calls reduce four operands to two, and a third round answers);
            a tree's ``data.branching`` names one width per round.
    """

    LOW, HIGH = 10, 30
    PROMPTS = 1200

    def __init__(
        self,
        operand_counts: tuple[int, ...] = (2, 3, 4),
        correct_reward: float = 1.0,
        wrong_reward: float = -1.0,
        ask_cost: float = 0.1,
        malformed_reward: float = -1.0,
        no_answer_reward: float = -0.5,
        heldout_size: int = 300,
        split_seed: int = 0,
        train_order_seed: int | None = None,
        use_chat_template: bool = False,
        max_rounds: int = 3,
    ) -> None:
        if not operand_counts or any(k not in (2, 3, 4) for k in operand_counts):
            raise InputError(f"CalculatorTask: operand_counts must be a non-empty list of 2, 3 or 4, got "
                             f"{list(operand_counts)}")
        super().__init__(correct_reward, wrong_reward, ask_cost, malformed_reward, no_answer_reward, heldout_size,
                         split_seed, use_chat_template, max_rounds)
        self.operand_counts = tuple(operand_counts)
        self.train_order_seed = train_order_seed

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """``PROMPTS`` distinct operand tuples, an equal share for each operand count, shuffled; the first
        ``heldout_size`` are held out, their first half validating and the rest testing (``halves``)."""
        rng = random.Random(self.split_seed)
        records = []
        for count in self.operand_counts:
            tuples: set[tuple[int, ...]] = set()
            while len(tuples) < self.PROMPTS // len(self.operand_counts):  # 21**2 = 441 >= 400 two-operand sums
                tuples.add(tuple(rng.randint(self.LOW, self.HIGH) for _ in range(count)))
            records.extend(self.record(list(t)) for t in sorted(tuples))
        rng.shuffle(records)
        return (reordered(records[self.heldout_size:], self.train_order_seed), *halves(records[: self.heldout_size]))

    @staticmethod
    def record(operands: list[int]) -> PromptRecord:
        return {"prompt": expression(operands), "answer": str(sum(operands)), "operands": list(operands)}

    @staticmethod
    def oracle_questions(record: PromptRecord) -> int:
        """The oracle's calls on ``record``: until two operands remain."""
        return max(len(record["operands"]) - 2, 0)

    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        """The ``round_index``-th call (every earlier segment of a running episode was a call) reduces the
        original expression ``round_index`` times."""
        return expression(reduced(prompt_record["operands"], round_index))


def reduced(operands: list[int], calls: int) -> list[int]:
    """The operands after ``calls`` calculator calls, each replacing the first two by their sum:
    ``reduced([12, 25, 17], 1) == [37, 17]``, and a single number stays."""
    calls = min(calls, len(operands) - 1)
    return [sum(operands[: calls + 1])] + list(operands[calls + 1:])


def expression(operands: list[int]) -> str:
    """``12+25+17=`` for ``[12, 25, 17]``."""
    return "+".join(str(x) for x in operands) + "="
