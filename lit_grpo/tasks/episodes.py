"""Multi-round tasks: one episode interface (``MultiRoundTask.turn``) for every task whose episodes run over turns,
the games' (``GameTask``) and the tool tasks' (docs/guide.md#multi-round-tasks-and-tree-rollouts)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lit_grpo.run.rules import NamesAnswerTokens
from lit_grpo.tasks.base import PromptRecord, Task

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
    """A task whose episodes run over turns: the policy writes a segment, the environment answers it (``turn``), until
    a segment ends the episode. ``turn`` is the one method every multi-round task implements: a game answers from its
    record alone (``GameTask.step``), a tool task from the episode's state (its conversation, its environment).

    What an episode may hold beyond its record has a hook each, all with defaults that keep none: its state at the
    start (``start_episode``, e.g. a per-rollout environment) and its first context (``episode_prompt_ids``), a copy of
    it for each child of a tree node (``branch``: a fork, or a fresh start replaying the path), a token budget
    (``tokens_left``, ``sequence_budget``, ``without_reply``), scores given once the batch has ended
    (``EnvStep.scored_later`` and ``score_episodes``) and what it holds released (``end_episodes``). A turn's own
    reward is ``EnvStep.reward``; an environment ends the episode with a terminal step (kind ``finished``).
    ``no_answer_reward`` scores an episode cut off at ``max_depth`` rounds and ``malformed_reward`` a segment that is
    neither an answer nor a question.
    """

    @property
    @abstractmethod
    def max_rounds(self) -> int | None:
        """The rounds an episode runs at most: a tree or chain rollout names one width per round
        (``data.branching``), and a list of another length is refused (run/rules.py ``declared_rounds``). A task
        sets it through an ``__init__`` argument named ``max_rounds`` (a tool task: ``max_turns``), read off the
        configuration before the task is built, or as a class attribute ``max_rounds``."""

    @abstractmethod
    def turn(self, prompt_record: PromptRecord, episode: Any, round_index: int, segment_text: str, tokenizer: Any,
             truncated: bool, segment_ids: Sequence[int] = (), context_ids: Sequence[int] = ()) -> EnvStep:
        """The environment's response to round ``round_index``'s segment (1-based; its text, and its ``segment_ids``
        sampled after ``context_ids``; ``truncated``: cut at the token limit), from the episode's state (from
        ``branch``: this child's own). The step's ``episode`` is the state the next turn continues from."""

    @property
    @abstractmethod
    def no_answer_reward(self) -> float:
        """The reward of an episode the environment closes at ``max_depth`` without an answer."""

    @property
    @abstractmethod
    def malformed_reward(self) -> float:
        """The reward of a segment that is neither an answer nor a question."""

    @property
    def reuses_turn_cache(self) -> bool:
        """Whether the engine may keep a row's cache from one turn for the next (``SamplingSpec.next_turn``): a chat
        task's long prompts (a tool task's) are worth it; the games' prompts are a few ids, whose prefill costs
        nothing, and without it their runs keep their numbers to the last bit."""
        return False

    def start_episode(self, prompt_record: PromptRecord) -> Any:
        """The state an episode starts from (None: the games keep none beyond their record)."""
        return None

    def episode_prompt_ids(self, prompt_record: PromptRecord, episode: Any, tokenizer: Any) -> list[int]:
        """The first turn's context: the prompt's ids (an episode's start may add to it)."""
        return self.prompt_ids(prompt_record, tokenizer)

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
        """``step`` ended where its reply would pass the episode's budget or the model's context: the episode ends
        cut, scored ``no_answer_reward`` (a tool task drops the reply and keeps its turn scored, as TRL does)."""
        return EnvStep("cut", self.no_answer_reward, terminal=True, episode=step.episode)

    def score_episodes(self, episodes: Sequence[Any], completion_ids: Sequence[Sequence[int]],
                       context: Any = None) -> list[Any]:
        """The scores of the batch's episodes that ended ``scored_later`` (a tool task's: its rewards called once per
        batch, as TRL calls them). Only a task whose turns return ``scored_later`` steps is asked; none here."""
        if episodes:
            raise TypeError(f"{type(self).__name__}: a turn ended scored_later, and the task has no score_episodes")
        return []

    def end_episodes(self, episodes: Sequence[Any]) -> None:
        """Release what the batch's episodes hold (a tool task's environments go back to their pool)."""


class GameTask(MultiRoundTask):
    """A game: a multi-round task whose environment keeps no state beyond the record, so each turn is ``step``,
    which reads the record, the round and the segment's text alone. A grouped rollout scores a completion as the
    first round (``reward``)."""

    @abstractmethod
    def step(self, prompt_record: PromptRecord, round_index: int, segment_text: str) -> EnvStep:
        """The environment's response to the policy's segment of round ``round_index`` (1-based)."""

    def turn(self, prompt_record: PromptRecord, episode: Any, round_index: int, segment_text: str, tokenizer: Any,
             truncated: bool, segment_ids: Sequence[int] = (), context_ids: Sequence[int] = ()) -> EnvStep:
        """A game's turn is its ``step``."""
        return self.step(prompt_record, round_index, segment_text)

    def reward(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        """Single-round view: the first segment's reward."""
        return self.step(prompt_record, 1, completion_text).reward


def names_answer_tokens(task: Any) -> bool:
    """Whether a task (or its class) says which first tokens answer (an ``answer_token_ids(tokenizer)`` method, as
    the question games have): what the value rule needs to force an answer."""
    return isinstance(task, NamesAnswerTokens) if not isinstance(task, type) else issubclass(task, NamesAnswerTokens)
