"""One tool episode's state, and how a tree gives each branch its own (docs/guide.md#tools-and-environments).

An ``Episode`` is the state after one assistant turn: the conversation so far, what its calls did, and the rollout's
``ToolBox`` (its tools and its environment instance). A chain's turns share one box, each turn a new ``Episode``. A
tree branches: every child after the first needs the environment as it was before any sibling's calls, so it gets
either the environment's own copy (``ToolBox.fork``: a class that defines ``__deepcopy__`` or
``fork_environment()``) or a fresh instance reset with the same row that replays the path's calls, whose tool
messages must equal the recorded ones (``replayed``). An environment is never pickled or copied otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord


@dataclass(frozen=True)
class TurnCalls:
    """One past turn's parsed calls and the tool messages they answered (what a replay must reproduce)."""

    calls: tuple[dict[str, Any], ...]
    messages: tuple[dict[str, Any], ...]


@dataclass
class Episode:
    """A tool episode after a turn. ``messages``: the conversation (the prompt's ``prompt_messages`` first);
    ``toolbox``: the rollout's tools and environment; ``calls``/``failures``: calls (failed calls) per tool name
    along the path; ``turns``: each past turn's calls; ``prompt_length``: the prompt's ids as the engine receives
    them; ``reset_text``: what the environment's ``reset`` added to the prompt."""

    messages: list[dict[str, Any]]
    prompt_messages: int
    toolbox: Any
    schemas: tuple[dict[str, Any], ...]
    row: PromptRecord
    environment_name: str | None = None
    reset_text: Any = None
    calls: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    turns: tuple[TurnCalls, ...] = ()
    prompt_length: int = 0
    malformed: bool = False
    parts: dict[str, float | None] = field(default_factory=dict)  # each reward's value, once scored
    errors: tuple[str, ...] = ()  # the rewards that failed on it, once scored
    extra: dict[str, Any] = field(default_factory=dict)  # what the rewards logged for it (log_extra), once scored

    @property
    def completion(self) -> list[dict[str, Any]]:
        """The messages after the prompt, as TRL passes a conversational completion to a reward."""
        return self.messages[self.prompt_messages:]

    @property
    def environment(self) -> Any:
        """The rollout's environment (the live instance, or the proxy of one hosted in a worker), None without."""
        return self.toolbox.environment if self.toolbox is not None else None

    def next(self) -> Episode:
        """A copy for the next turn: its own message list and counts, the same box."""
        return dataclasses.replace(self, messages=list(self.messages), calls=dict(self.calls),
                                   failures=dict(self.failures), parts={})


def counted(episode: Episode, outcomes: Sequence[Any]) -> None:
    """Add a turn's call outcomes to the episode's per-tool counts."""
    for outcome in outcomes:
        episode.calls[outcome.name] = episode.calls.get(outcome.name, 0) + 1
        if outcome.failure is not None:
            episode.failures[outcome.name] = episode.failures.get(outcome.name, 0) + 1


def replayed(episode: Episode, fresh: Any, reset_text: Any, environment: str) -> Episode:
    """``episode`` continued on ``fresh`` (a new box reset with the same row, which returned ``reset_text``): the
    path's calls run again and their tool messages checked against the recorded ones. ``InputError`` naming the
    environment where they differ: its calls do not replay (state outside the instance, randomness), so a tree
    cannot branch it; chains never need a copy."""
    def diverged(what: str) -> InputError:
        fresh.release()
        return InputError(f"environment {environment}: a tree branch replays the path's calls on a new instance "
                          f"reset with the same row, and {what}: the environment does not replay (it has state "
                          "outside the instance, or randomness); give its class __deepcopy__ or fork_environment() "
                          "to copy itself, or use data.rollout chains (no copy needed)")

    if reset_text != episode.reset_text:
        raise diverged(f"reset returned {reset_text!r:.80} where the first instance returned "
                       f"{episode.reset_text!r:.80}")
    for turn, past in enumerate(episode.turns, start=1):
        messages = tuple(outcome.message for outcome in fresh.call_turn(list(past.calls)))
        if fresh.lost:  # a replayed call timed out (or its host died): this branch's box is lost, its turn ends it
            break
        if messages != past.messages:
            raise diverged(f"turn {turn}'s tool messages came back {messages!r:.120} instead of "
                           f"{past.messages!r:.120}")
    return dataclasses.replace(episode.next(), toolbox=fresh)


def appended(content: Any, added: Any) -> Any:
    """A user message's content with what ``reset`` returned after it, as TRL appends it (text to text, blocks to
    blocks)."""
    if isinstance(added, list) and isinstance(content, str):
        return [{"type": "text", "text": content}, *added]
    if isinstance(added, str) and isinstance(content, list):
        return [*content, {"type": "text", "text": added}]
    return content + added


def conversation(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as chat messages: a conversation as given (copied), text as one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise InputError(f"ToolTask: a prompt is a conversation (a list of role/content messages) or text, got "
                     f"{type(prompt).__name__}")
