"""Multi-round tasks: the policy answers (infer) or asks (defer) and the environment replies
(docs/guide.md#multi-round-tasks-and-tree-rollouts)."""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord, Task
from lit_grpo.tasks.splits import halves

SegmentKind = Literal["answer", "ask", "malformed", "call", "cut", "finished"]  # finished: the environment ended it


class RowUnavailable(Exception):
    """A row whose episode cannot start (an environment's ``reset`` raised for it): the rollout skips the row with
    one warning and goes on, as a failed call is the model's to read, not the run's to stop."""


@dataclass(frozen=True)
class ChatReply:
    """A reply given as chat messages (tool results): the rollout renders their ids through the chat template, as
    the conversation with them minus the conversation without them (``rollout/turn_tokens.py``)."""

    conversation: tuple[dict[str, Any], ...]  # every message up to and including the assistant turn replied to
    messages: tuple[dict[str, Any], ...]  # the reply (``tool`` messages)
    tools: tuple[dict[str, Any], ...] = ()  # the tools' schemas, as the prompt rendered them
    chat_template: str | None = None  # the template every rendering uses (None: the tokenizer's own)
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # chat_template_kwargs of every rendering


@dataclass(frozen=True)
class EnvStep:
    """What the environment makes of one policy segment.

    ``terminal`` segments end the episode (an answer, or a malformed segment); a continuing one (a question, a tool
    call) gets ``reply``, text the environment inserts into the context before the next round, or ``chat_reply``,
    messages the chat template renders; those tokens carry no loss. ``reward`` is the segment's immediate reward
    r(c); ``episode`` is the state the next turn continues from (a task's own; None for the games).
    ``scored_later``: a terminal step whose reward the task gives once the whole batch has ended
    (``MultiRoundTask.score_episodes``: a tool task's rewards are called once per batch, as TRL calls them).
    """

    kind: SegmentKind
    reward: float
    terminal: bool
    reply: str = ""
    correct: bool = False
    chat_reply: ChatReply | None = None
    episode: Any = None
    scored_later: bool = False


class MultiRoundTask(Task):
    """A task whose episodes run over rounds until the policy answers.

    Subclasses define ``step``; ``no_answer_reward`` scores an episode cut off at ``max_depth`` rounds and
    ``malformed_reward`` a segment that is neither an answer nor a question.
    """

    # True for a task that drives its episodes through ``turn`` with a state of its own (a tool task), read by the
    # rules (run/rules.py) by this name: such a task needs turns (chains or a tree), one width per turn
    owns_turns: ClassVar[bool] = False

    @property
    @abstractmethod
    def max_rounds(self) -> int | None:
        """The rounds an episode runs at most: a tree or chain rollout names one width per round
        (``data.branching``), and a list of another length is refused (run/rules.py ``declared_rounds``). A task
        sets it through an ``__init__`` argument named ``max_rounds`` (a tool task: ``max_turns``), read off the
        configuration before the task is built, or as a class attribute ``max_rounds``."""

    @abstractmethod
    def step(self, prompt_record: PromptRecord, round_index: int, segment_text: str) -> EnvStep:
        """The environment's response to the policy's segment of round ``round_index`` (1-based)."""

    @property
    @abstractmethod
    def no_answer_reward(self) -> float:
        """The reward of an episode the environment closes at ``max_depth`` without an answer."""

    @property
    @abstractmethod
    def malformed_reward(self) -> float:
        """The reward of a segment that is neither an answer nor a question."""

    def start_episode(self, prompt_record: PromptRecord) -> Any:
        """The state an episode starts from (None: the games keep none beyond their record)."""
        return None

    def episode_prompt_ids(self, prompt_record: PromptRecord, episode: Any, tokenizer: Any) -> list[int]:
        """The first turn's context: the prompt's ids (an episode's start may add to it)."""
        return self.prompt_ids(prompt_record, tokenizer)

    def turn(self, prompt_record: PromptRecord, episode: Any, round_index: int, segment_text: str, tokenizer: Any,
             truncated: bool, segment_ids: Sequence[int] = (), context_ids: Sequence[int] = ()) -> EnvStep:
        """The environment's response to round ``round_index``'s segment (its text, and its ``segment_ids`` sampled
        after ``context_ids``), from the episode's state (from ``branch``: this child's own). The games answer by
        ``step``."""
        return self.step(prompt_record, round_index, segment_text)

    def branch(self, episode: Any, count: int) -> list[Any]:
        """The states ``count`` children of a node start their turns from, one each (the games keep none)."""
        return [episode] * count

    def tokens_left(self, episode: Any, context_length: int) -> int | None:
        """The tokens the next turn may take within the episode's whole budget (None: no budget but
        ``max_new_tokens``)."""
        return None

    def sequence_budget(self) -> int | None:
        """The tokens one episode may hold where an episode is one sequence of the loss (a tool task's chain: TRL's
        ``max_completion_length``, what ``constant`` aggregation divides by); None: a turn is a sequence."""
        return None

    def without_reply(self, step: EnvStep) -> EnvStep:
        """``step`` ended where its reply would pass the episode's budget or the model's context (a tool task drops
        the reply, as TRL drops it); the games' replies are a few tokens, checked before the run."""
        return EnvStep("cut", self.no_answer_reward, terminal=True, episode=step.episode)

    def score_episodes(self, episodes: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                       context: Any = None) -> list[Any]:
        """The scores of the batch's episodes that ended ``scored_later`` (a tool task's). The games score as they
        step."""
        raise NotImplementedError(f"{type(self).__name__} scores each step as it goes")

    def end_episodes(self, episodes: Sequence[Any]) -> None:
        """Release what the batch's episodes hold (a tool task's environments go back to their pool)."""

    def defer_token_ids(self, tokenizer: Any) -> list[int]:
        """The first tokens that start a defer (a question): the only ones the risk rule allows when it forces a
        defer. Tasks used with a risk head override this."""
        raise NotImplementedError(f"{type(self).__name__} does not say which first tokens defer (defer_token_ids)")

    def answer_token_ids(self, tokenizer: Any) -> list[int]:
        """The first tokens that start an answer: the only ones the value rule allows when it forces an answer.
        Tasks used with that rule override this."""
        raise NotImplementedError(f"{type(self).__name__} does not say which first tokens answer (answer_token_ids)")

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        """Single-round view: the first segment's reward."""
        return self.step(prompt_record, 1, completion_text).reward



def names_answer_tokens(task: Any) -> bool:
    """Whether a task (or its class) says which first tokens answer: a ``MultiRoundTask`` overriding
    ``answer_token_ids``."""
    cls = task if isinstance(task, type) else type(task)
    return issubclass(cls, MultiRoundTask) and cls.answer_token_ids is not MultiRoundTask.answer_token_ids


class AskOrAnswerTask(MultiRoundTask):
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


class ClarifyTask(AskOrAnswerTask):
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
            policy that asked twice still answer); ``data.branching`` names one width per round.
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
        if not 0 <= hidden_fraction <= 1:
            raise InputError(f"ClarifyTask: hidden_fraction must be in [0, 1], got {hidden_fraction}")
        super().__init__(correct_reward, wrong_reward, ask_cost, malformed_reward, no_answer_reward, heldout_size,
                         split_seed, use_chat_template, max_rounds)
        self.hidden_fraction = hidden_fraction

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """Every operand pair, shuffled; the first ``heldout_size`` held out, their first half validating and the
        rest testing (``halves``)."""
        rng = random.Random(self.split_seed)
        pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        rng.shuffle(pairs)
        records = [self.record(a, b, rng.random() < self.hidden_fraction) for a, b in pairs]
        return (records[self.heldout_size :], *halves(records[: self.heldout_size]))

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
