"""What a task is: training prompts, validation and test prompts held out from them, and rewards on completions
(docs/guide.md#your-own-task-or-reward)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.rewards.answers import (
    REWARD_LIMIT,
    AnswerError,
    plain_copy,
    reward_number,
    weights_problem,
)
from lit_grpo.tasks.splits import Splits, given_splits, no_test_split_message
from lit_grpo.tasks.rewards.guard import reward_outcome

PromptRecord = dict[str, Any]
Messages = list[dict[str, str]]  # a conversation: {"role": ..., "content": ...} in order


def is_conversation(prompt: Any) -> bool:
    """Whether a record's prompt is a list of chat messages rather than a string."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def prompt_text(record: PromptRecord) -> str:
    """A record's prompt as one line of text for logs and tables: the string itself, or each message as
    ``role: content`` joined by `` | ``."""
    prompt = record["prompt"]
    if is_conversation(prompt):
        return " | ".join(f"{m['role']}: {m['content']}" for m in prompt)
    return str(prompt)


class Reward(ABC):
    """A reward function, called once per completion.

    Subclass it and point a task at it by class path (``class_path: my_pkg.MyReward``). It receives the prompt's
    record (its ``prompt`` text, reference ``answer`` and whatever else the task stores), the completion decoded up
    to EOS with special tokens skipped, and the completion's token ids as generated.

    Set ``min_value`` to the lowest score the reward gives: a completion whose reward raises scores it, so that
    crashing never pays more than a real wrong answer.
    """

    min_value: float | None = None

    @abstractmethod
    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        """Score one completion."""


class ExactMatchReward(Reward):
    """1.0 if the stripped completion equals the record's ``answer`` (stripped), else 0.0."""

    min_value = 0.0

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return 1.0 if completion_text.strip() == str(prompt_record["answer"]).strip() else 0.0


@dataclass(frozen=True)
class ScoredCompletion:
    """A completion's reward; ``error`` holds the reward function's failure message when it raised; ``parts`` each
    named reward's value when the task combines several (``None``: it did not apply)."""

    reward: float
    correct: bool
    error: str | None = None
    parts: dict[str, float | None] | None = None


class Task(ABC):
    """Prompts in three disjoint splits (training, validation, test), and how completions are scored.

    Args:
        use_chat_template: render each prompt through the tokenizer's chat template as one user turn (for
            instruction-tuned models); the tiny default model takes plain prompts.
    """

    def __init__(self, use_chat_template: bool = False) -> None:
        self.use_chat_template = use_chat_template
        self.reward_fn: Callable[[PromptRecord, str, Sequence[int]], float] | None = None

    @abstractmethod
    def split(self) -> tuple[Sequence[PromptRecord], ...]:
        """``(training, validation, test)`` records, pairwise disjoint; built once, on first use. Each record has a
        ``prompt`` text; training records come in the order epochs consume them.

        A task written before test splits existed returns ``(training, held-out)``: its held-out records are the
        validation split, and ``test_records`` refuses (``lit-grpo test`` would otherwise report the prompts a
        validation selected on)."""

    @cached_property
    def _records(self) -> Splits:
        return given_splits(type(self).__name__, self.split())

    def train_records(self) -> Sequence[PromptRecord]:
        """The training prompts in the order epochs consume them."""
        return self._records.train

    def validation_records(self) -> Sequence[PromptRecord]:
        """The validation prompts: what every validation and calibration reads."""
        return self._records.validation

    def test_records(self) -> Sequence[PromptRecord]:
        """The test prompts, disjoint from training and validation; refused (``InputError``) when the task gives
        none."""
        test = self._records.test
        if not test:
            raise InputError(no_test_split_message(type(self).__name__, test is None))
        return test

    def heldout_records(self) -> Sequence[PromptRecord]:
        """Every prompt training never sees: the validation prompts, then the test prompts."""
        return [*self._records.validation, *(self._records.test or [])]

    def keep_records(self, train: Sequence[PromptRecord], heldout: Sequence[PromptRecord]) -> None:
        """Replace the splits by subsets of them (prompts too long for the model dropped): ``train`` for training,
        and of validation and test the records that ``heldout`` keeps (the same objects)."""
        kept = {id(record) for record in heldout}
        validation, test = self._records.validation, self._records.test
        self.__dict__["_records"] = Splits(list(train), [r for r in validation if id(r) in kept],
                                           None if test is None else [r for r in test if id(r) in kept])

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        """The reward of one completion: ``reward_fn``'s, unless a subclass scores it itself."""
        if self.reward_fn is None:
            raise InputError(f"task: {type(self).__name__} sets no reward_fn and does not override reward(); set "
                             "self.reward_fn in its __init__ (a callable (prompt_record, completion_text, "
                             "completion_ids) -> float) or define reward()")
        return self.reward_fn(prompt_record, completion_text, completion_ids)

    def is_correct(self, prompt_record: PromptRecord, completion_text: str) -> bool:
        """Whether the completion is the reference answer: what ``accuracy`` counts."""
        return completion_text.strip() == str(prompt_record.get("answer", "")).strip()

    def answer_of(self, prompt_record: PromptRecord, completion_text: str) -> Hashable | None:
        """The answer a completion gives, as ``is_correct`` reads it: what a sampled evaluation's ``maj@n`` votes on
        (None: no answer could be extracted, no vote). A task that checks answers otherwise overrides both."""
        return completion_text.strip()

    @property
    def failure_reward(self) -> float:
        """What a completion scores when its reward function raises: never more than a real wrong answer."""
        return 0.0

    def score(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> ScoredCompletion:
        """Reward and correctness of a completion, the reward computed on a copy of the record. A reward function
        that raises (``sys.exit`` and its own ``KeyboardInterrupt`` included: ``rewards/guard.py``), or returns anything but a real number within ``±REWARD_LIMIT`` (a
        ``bool`` counts 1 or 0), scores ``failure_reward`` and the error is recorded: a NaN would poison the step,
        1e308 overflow the group statistics, and a string is no reward."""
        correct = self.is_correct(plain_copy(prompt_record), completion_text)
        answer, error = reward_outcome(lambda: self.reward(plain_copy(prompt_record), completion_text,
                                                           list(completion_ids)))
        if error is not None:  # any failure of user code fails the completion, not the run
            return ScoredCompletion(self.failure_reward, correct, f"{type(error).__name__}: {error}")
        try:
            value = reward_number(answer)
        except AnswerError as error:
            return ScoredCompletion(self.failure_reward, correct, f"reward {error}")
        if value is None:  # one reward, and it does not apply: nothing scores the completion
            return ScoredCompletion(self.failure_reward, correct,
                                    f"reward {answer!r:.60} is not a finite number within ±{REWARD_LIMIT:g}")
        return ScoredCompletion(value, correct)

    def score_group(self, records: Sequence[PromptRecord], texts: Sequence[str],
                    ids: Sequence[Sequence[int]]) -> list[ScoredCompletion]:
        """``score`` of each completion (``records[i]`` is completion i's prompt); a task whose rewards see a whole
        batch at once (``DatasetTask``) overrides it."""
        return [self.score(record, text, row) for record, text, row in zip(records, texts, ids)]

    def use_device(self, device: Any) -> None:
        """Where the policy runs (the data module tells the task at setup, before the model loads): for rewards that
        run a model."""

    def data_source(self) -> str | None:
        """The data file or dataset the prompts come from, to name it in a checkpoint's task record; None here."""
        return None

    def reward_weights(self) -> dict[str, float]:
        """Each named reward's weight in the task's sum, for advantages that weigh them apart (``advantage_mode:
        gdpo``); empty here: one unnamed reward."""
        return {}

    def tool_names(self) -> list[str]:
        """Every tool the task's episodes may call (a tool task's; none here): the metrics log each by name."""
        return []

    def close(self) -> None:
        """Release what the task started (a tool task's worker process); the DataModule's teardown calls it. Here:
        nothing."""

    def chat_text(self, prompt_record: PromptRecord, tokenizer: Any) -> str | None:
        """The prompt as the tokenizer's chat template renders it (generation prompt added), or ``None`` for a
        plain prompt: a conversation always goes through the template (system message kept); a string only with
        ``use_chat_template``, as one user turn."""
        prompt = prompt_record["prompt"]
        if not (is_conversation(prompt) or self.use_chat_template):
            return None
        messages = prompt if is_conversation(prompt) else [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def prompt_ids(self, prompt_record: PromptRecord, tokenizer: Any) -> list[int]:
        """Token ids of the prompt as the engine receives them."""
        text = self.chat_text(prompt_record, tokenizer)
        if text is not None:
            # rendered to text, then tokenized without special tokens (the template holds its own): transformers 5
            # returns a dict from tokenize=True
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        prompt = prompt_record["prompt"]
        if not isinstance(prompt, str):  # never a list's or dict's repr
            raise InputError(f"{type(self).__name__}: a prompt must be a string or a list of chat messages, got "
                             f"{type(prompt).__name__}")
        return list(tokenizer(prompt)["input_ids"])


class WeightedRewards:
    """A weighted sum of several rewards; weights default to 1 each."""

    def __init__(self, rewards: Sequence[Reward], weights: Sequence[float] | None = None) -> None:
        if not rewards:
            raise InputError("WeightedRewards: at least one reward is needed")
        problem = weights_problem(weights, len(rewards))
        if problem:
            raise InputError(problem)
        self.rewards = list(rewards)
        self.weights = [1.0] * len(rewards) if weights is None else [float(w) for w in weights]

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return sum(w * r(prompt_record, completion_text, completion_ids) for w, r in zip(self.weights, self.rewards))
