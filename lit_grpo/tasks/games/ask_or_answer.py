"""The rules the question games share: ask (``?``) or answer (digits) (docs/guide.md#multi-round-tasks-and-tree-rollouts)."""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.episodes import EnvStep, GameTask


def reordered(train: list[PromptRecord], seed: int | None) -> list[PromptRecord]:
    """``train`` shuffled with ``seed`` (the same prompts in another order: each seed of a benchmark its own order);
    as it is for ``None``."""
    if seed is not None:
        random.Random(seed).shuffle(train)
    return train


class AskOrAnswerTask(GameTask):
    """The rules the question games share: a segment ``?`` asks (reward ``-ask_cost``; the environment replies with
    ``reply``), a segment of digits answers (``correct_reward`` if it is the record's answer, else
    ``wrong_reward``), anything else is malformed. Subclasses give the prompts (``split``) and ``reply``."""

    def __init__(self, correct_reward: float, wrong_reward: float, ask_cost: float, malformed_reward: float,
                 no_answer_reward: float, heldout_size: int, split_seed: int, use_chat_template: bool,
                 max_rounds: int) -> None:
        super().__init__(use_chat_template)
        if max_rounds < 1:
            raise InputError(f"{type(self).__name__}: max_rounds must be >= 1, got {max_rounds}")
        self._max_rounds = max_rounds
        if not wrong_reward < -ask_cost < correct_reward:
            raise InputError(f"{type(self).__name__}: need wrong_reward < -ask_cost < correct_reward, or asking can "
                             f"never pay or never cost; got {wrong_reward}, {ask_cost}, {correct_reward}")
        self.correct_reward, self.wrong_reward, self.ask_cost = correct_reward, wrong_reward, ask_cost
        self._malformed, self._no_answer = malformed_reward, no_answer_reward
        self.heldout_size, self.split_seed = heldout_size, split_seed

    @abstractmethod
    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        """The environment's answer to the question asked at round ``round_index`` (1-based)."""

    @staticmethod
    @abstractmethod
    def oracle_questions(record: PromptRecord) -> int:
        """How many questions the oracle policy asks on ``record`` before it answers."""

    def informed_questions(self, record: PromptRecord) -> int:
        """Questions after which the answer depends on skill only (everything hidden is revealed)."""
        return self.oracle_questions(record)

    def oracle_return(self, records: Sequence[PromptRecord]) -> float:
        """Mean return on ``records`` of the oracle: ``oracle_questions(record)`` questions, then the right answer."""
        return sum(self.correct_reward - self.ask_cost * self.oracle_questions(r) for r in records) / len(records)

    @property
    def max_rounds(self) -> int:
        return self._max_rounds

    @property
    def no_answer_reward(self) -> float:
        return self._no_answer

    @property
    def malformed_reward(self) -> float:
        return self._malformed

    @property
    def failure_reward(self) -> float:
        return min(self.wrong_reward, self._malformed, self._no_answer, -self.ask_cost)

    def defer_token_ids(self, tokenizer: Any) -> list[int]:
        return tokenizer("?", add_special_tokens=False)["input_ids"][:1]

    def answer_token_ids(self, tokenizer: Any) -> list[int]:
        """The first tokens of an answer (the digits): the only ones a rule allows when it forces an answer."""
        return sorted({tokenizer(str(digit), add_special_tokens=False)["input_ids"][0] for digit in range(10)})

    def step(self, prompt_record: PromptRecord, round_index: int, segment_text: str) -> EnvStep:
        text = segment_text.strip()
        if text == "?":
            return EnvStep("ask", -self.ask_cost, terminal=False, reply=self.reply(prompt_record, round_index))
        if text.isdigit():
            correct = text == prompt_record["answer"]
            return EnvStep("answer", self.correct_reward if correct else self.wrong_reward, True, correct=correct)
        return EnvStep("malformed", self._malformed, terminal=True)
