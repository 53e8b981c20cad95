"""A multi-turn task whose turns call tools (docs/guide.md#tools-and-environments): the prompts are conversations,
the tools' schemas go through the model's own chat template, the model's calls are read by transformers' response
parsing for that template, each call's answer goes back as a ``tool`` message, and the episode ends at a turn without
a call or at ``max_turns``. In the tree's terms a turn with calls defers (the tool messages are the reply), a turn
without one infers; its reward scores the whole conversation."""

from __future__ import annotations

import copy
import json
import pkgutil
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.multiround import ChatReply, EnvStep, MultiRoundTask, RowUnavailable
from lit_grpo.tasks.reward_functions import import_reward
from lit_grpo.tasks.splits import halves
from lit_grpo.tasks.tool_worker import ToolWorker
from lit_grpo.tasks.tools import ToolBox


@dataclass
class Episode:
    """One path's state: the conversation so far (the prompt's messages first), its tools and environment, and
    what its calls did. Each turn continues from a copy of its parent's (siblings branch from the same state)."""

    messages: list[dict[str, Any]]
    prompt_messages: int
    toolbox: ToolBox
    schemas: tuple[dict[str, Any], ...]
    calls: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def completion(self) -> list[dict[str, Any]]:
        """The messages after the prompt, as TRL passes a conversational completion to a reward."""
        return self.messages[self.prompt_messages:]


RewardFunction = Callable[..., Sequence[float | None]]


class ToolTask(MultiRoundTask):
    """Prompts with tools (functions) or an environment, scored by reward functions over the whole conversation.

    Args:
        path: the episodes' rows, a data file as ``DatasetTask`` reads one (``prompt``: a conversation, or text for
            one user message; any other columns the environment's ``reset`` and the rewards read).
        records: the rows themselves, from Python (instead of ``path``).
        tools: tool functions (type hints and a Google-style docstring each), or their import paths.
        environment: a class, or its import path (TRL's ``environment_factory``): one instance per episode,
            ``reset(**row)`` before its first turn (text it returns is added to the last user message), its public
            methods the tools, its ``get_reward()`` (when it has one) added to the rewards. Copied with
            ``copy.deepcopy`` where a tree branches, so each child has its own state.
        rewards: functions (or ``package.module.function`` / ``path/to/file.py:function``, as DatasetTask reads
            them) with TRL's signature, ``f(prompts, completions, **columns) ->
            list[float | None]``, given the conversations (and ``environments=``); their sum is the episode's reward.
        max_turns: assistant turns at most (TRL's ``max_tool_calling_iterations`` + 1); a turn that still calls a
            tool at the limit ends the episode, scored as it stands.
        malformed_reward: the reward of a turn whose call cannot be read (and of a reward that fails).
        success_reward: an episode with at least this reward counts as correct (``val/accuracy``).
        tool_timeout: seconds a call may run before it answers an error; with a timeout the calls run in a worker
            process that is killed at it (an environment's state then travels with each call: it must pickle).
            null: the calls run in the training process, unbounded.
        max_tool_chars: the longest answer the model sees.
        heldout_size: rows held out, disjoint from training: half validation, half test.
        split_seed: seed of the held-out draw.
    """

    owns_turns = True

    def __init__(self, path: str | None = None, records: Sequence[PromptRecord] | None = None,
                 tools: Sequence[Callable | str] = (), environment: type | str | None = None,
                 rewards: Sequence[RewardFunction | str] = (), max_turns: int = 4, malformed_reward: float = -1.0,
                 success_reward: float = 1.0, tool_timeout: float | None = 10.0, max_tool_chars: int = 4000,
                 heldout_size: int = 100, split_seed: int = 0) -> None:
        super().__init__(use_chat_template=True)
        if (path is None) == (records is None):
            raise InputError("ToolTask: give path (a data file) or records (rows from Python), one of them")
        if tool_timeout is not None and tool_timeout <= 0:
            raise InputError(f"ToolTask: tool_timeout must be positive (seconds), or null to run calls unbounded in "
                             f"the training process; got {tool_timeout}")
        self.environment = imported(environment) if isinstance(environment, str) else environment
        if not rewards and not callable(getattr(self.environment, "get_reward", None)):
            raise InputError("ToolTask: give rewards, or an environment with get_reward() (it then owns the reward)")
        self.path, self.given = path, None if records is None else [dict(r) for r in records]
        self.tools = [imported(t) if isinstance(t, str) else t for t in tools]
        self.rewards = [import_reward(r) if isinstance(r, str) else r for r in rewards]  # DatasetTask's reading
        self.max_turns, self._malformed, self.success_reward = max_turns, malformed_reward, success_reward
        self.tool_timeout, self.max_tool_chars = tool_timeout, max_tool_chars
        self.heldout_size, self.split_seed = heldout_size, split_seed
        self._worker: ToolWorker | None = None
        self._renders_tools: set[int] = set()  # the tokenizers whose templates were seen to render the schemas

    @property
    def max_rounds(self) -> int:
        """An episode's turns at most: ``max_turns``."""
        return self.max_turns

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """The rows shuffled by ``split_seed``; the first ``heldout_size`` held out, halved into validation and
        test; the rest trains."""
        from lit_grpo.tasks.data_files import load_rows

        rows = self.given if self.given is not None else [row for _, row in load_rows(str(self.path), "train")]
        if not 2 <= self.heldout_size < len(rows):
            raise InputError(f"ToolTask: heldout_size must be in [2, {len(rows) - 1}] for {len(rows)} rows, got "
                             f"{self.heldout_size}")
        order = list(range(len(rows)))
        random.Random(self.split_seed).shuffle(order)
        shuffled = [rows[i] for i in order]
        return (shuffled[self.heldout_size:], *halves(shuffled[:self.heldout_size]))

    @property
    def no_answer_reward(self) -> float:
        return self._malformed

    @property
    def malformed_reward(self) -> float:
        return self._malformed

    @property
    def failure_reward(self) -> float:
        return self._malformed

    def step(self, prompt_record: PromptRecord, round_index: int, segment_text: str) -> EnvStep:
        raise NotImplementedError("a ToolTask's turns need their episode: the rollout calls turn()")

    def start_episode(self, prompt_record: PromptRecord) -> Episode:
        environment = self.environment() if self.environment is not None else None
        messages = conversation(prompt_record["prompt"])
        if environment is not None:
            try:
                added = environment.reset(**{k: v for k, v in prompt_record.items() if k != "prompt"})
            except Exception as error:  # noqa: BLE001 - user code failing for one row: that row is skipped
                raise RowUnavailable(f"{type(error).__name__}: {error}") from error
            if added:  # TRL: text reset returns is appended to the last user message
                last = max(i for i, m in enumerate(messages) if m["role"] == "user")
                messages[last] = {**messages[last], "content": f"{messages[last]['content']}{added}"}
        box = ToolBox(self.tools, environment, self.tool_worker(), self.max_tool_chars)
        return Episode(messages, len(messages), box, tuple(box.schemas()))

    def tool_worker(self) -> ToolWorker | None:
        """The task's one ``ToolWorker`` (started at the first call), None without a timeout."""
        if self.tool_timeout is None:
            return None
        if self._worker is None:
            self._worker = ToolWorker({tool.__name__: tool for tool in self.tools}, self.tool_timeout)
        return self._worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def episode_prompt_ids(self, prompt_record: PromptRecord, episode: Episode, tokenizer: Any) -> list[int]:
        ids = list(tokenizer.apply_chat_template(episode.messages, tools=list(episode.schemas) or None,
                                                 tokenize=True, add_generation_prompt=True, return_dict=False))
        if episode.schemas and id(tokenizer) not in self._renders_tools:  # once per tokenizer
            without = tokenizer.apply_chat_template(episode.messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False)
            if list(without) == ids:
                raise InputError(f"the chat template of {getattr(tokenizer, 'name_or_path', 'the model')!r} does not "
                                 "render tools (tools=): the model would never see the tools' schemas; use a "
                                 "template that does (the model family's own, e.g. Qwen2.5's)")
            self._renders_tools.add(id(tokenizer))
        return ids

    def turn(self, prompt_record: PromptRecord, episode: Episode, round_index: int, segment_text: str,
             tokenizer: Any, truncated: bool) -> EnvStep:
        episode = copy.deepcopy(episode)  # the parent's state stays its other children's
        message = parsed_turn(tokenizer, segment_text, episode.schemas)
        if message is None:
            return EnvStep("malformed", self._malformed, terminal=True, episode=episode)
        episode.messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls or truncated or round_index >= self.max_turns:
            reward = self.episode_reward(prompt_record, episode)
            kind = "answer" if not calls else "cut"
            return EnvStep(kind, reward, terminal=True, correct=reward >= self.success_reward, episode=episode)
        replies = []
        for call in calls:
            outcome = episode.toolbox.call(call)
            name = outcome.message["name"]
            episode.calls[name] = episode.calls.get(name, 0) + 1
            if outcome.failure is not None:
                episode.failures[name] = episode.failures.get(name, 0) + 1
            replies.append(outcome.message)
        reply = ChatReply(tuple(episode.messages), tuple(replies), episode.schemas)
        episode.messages.extend(replies)
        return EnvStep("call", 0.0, terminal=False, chat_reply=reply, episode=episode)

    def episode_reward(self, prompt_record: PromptRecord, episode: Episode) -> float:
        """The sum of the rewards over the conversation (and the environment's own), TRL's way: a reward that
        returns None does not apply; none applying, or one raising, scores ``failure_reward``."""
        columns = {k: [v] for k, v in prompt_record.items() if k != "prompt"}
        environment = episode.toolbox.environment
        extra = {"environments": [environment]} if environment is not None else {}
        values = []
        try:
            for reward in self.rewards:
                (value,) = reward(prompts=[episode.messages[:episode.prompt_messages]],
                                  completions=[episode.completion], **extra, **columns)
                values.append(value)
            if callable(getattr(environment, "get_reward", None)):
                values.append(environment.get_reward())
        except Exception:  # noqa: BLE001 - a reward's failure scores failure_reward, never more than a wrong answer
            return self.failure_reward
        applied = [float(v) for v in values if v is not None]
        return sum(applied) if applied else self.failure_reward


def imported(path: str) -> Any:
    """The object at an import path (``package.module.name``), named in the error where it does not import."""
    try:
        return pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as error:
        raise InputError(f"ToolTask: {path!r} does not import ({error})") from None


def conversation(prompt: Any) -> list[dict[str, Any]]:
    """A prompt as chat messages: a conversation as given (copied), text as one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m for m in prompt):
        return [dict(m) for m in prompt]
    raise InputError(f"ToolTask: a prompt is a conversation (a list of role/content messages) or text, got "
                     f"{type(prompt).__name__}")


def parsed_turn(tokenizer: Any, text: str, schemas: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The assistant message in ``text`` by the tokenizer's own response parsing (``tokenizer.response_template``),
    tool-call arguments typed by the tools' schemas; None where a call cannot be read (malformed syntax)."""
    if getattr(tokenizer, "response_template", None) is None:
        raise InputError(f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'the model')!r} has no "
                         "response_template, so its tool calls cannot be read; set one (transformers' response "
                         "parsing docs; TRL's trl.chat_template_utils.add_response_schema knows released families)")
    try:
        message = tokenizer.parse_response(text, prefix="", tools=list(schemas) or None)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        return None
    calls = [well_formed(call) for call in message.get("tool_calls") or []]
    return {"role": "assistant", "content": message.get("content") or "", **({"tool_calls": calls} if calls else {})}


def well_formed(call: Any) -> dict[str, Any]:
    """A parsed call as the template renders it: a function with a name and an arguments object (a call that lacks
    them keeps what it has, with ``{}`` arguments, and the tool box answers it an error)."""
    function = call.get("function") if isinstance(call, dict) else None
    function = function if isinstance(function, dict) else {}
    arguments = function.get("arguments")
    return {"type": "function", "function": {**function, "name": str(function.get("name", "")),
                                             "arguments": arguments if isinstance(arguments, (dict, str)) else {}}}
