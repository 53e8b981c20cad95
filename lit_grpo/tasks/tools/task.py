"""A multi-turn task whose turns call tools, run as TRL 1.16's ``GRPOTrainer`` runs them
(docs/guide.md#tools-and-environments): the prompts are conversations rendered by the model's own chat template
with the tools' schemas; each assistant turn is parsed from its token ids by TRL's response parsing
(``chat_format.py``); the calls run in the rollout's ``ToolBox`` (``kit.py``: one environment instance per
rollout, reset with the whole row); each call's answer goes back as a ``tool`` message; the episode ends at a turn
without a call, at ``max_turns``, or where the whole conversation would pass ``max_completion_length``; the rewards
score every ended episode of a batch in one call (``rewards.py``). In the tree's terms a turn with calls defers
(the tool messages are the reply), a turn without one infers."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from lit_grpo.errors import InputError
from lit_grpo.mcp_tools import McpServer, McpServers, server_problems
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.tools.chat_format import ChatFormat, chat_format
from lit_grpo.tasks.episodes import ChatReply, EnvStep, MultiRoundTask, RowUnavailable
from lit_grpo.tasks.rewards.functions import import_reward, reward_name
from lit_grpo.tasks.splits import halves
from lit_grpo.tasks.tools.episode import Episode, TurnCalls, appended, conversation, counted, replayed
from lit_grpo.tasks.tools.kit import ToolKit, factories, imported
from lit_grpo.tasks.tools.rewards import EpisodeScore, RewardContext, environment_reward, score_batch
from lit_grpo.tasks.tools.turn_rewards import after_turn, steps_taken

RewardFunction = Callable[..., Sequence[float | None]]
Factory = Callable[[], Any]
MalformedTurns = Literal["reward", "penalty"]


class ToolTask(MultiRoundTask):
    """Prompts with tools (functions) or environments, scored by reward functions over the whole conversation.
    TRL's behaviour is every default; where lit-grpo offers more it is a named option (the guide's TRL table).

    Args:
        path: the episodes' rows, a data file as ``DatasetTask`` reads one (``prompt``: a conversation, or text for
            one user message; any other columns the environment's ``reset`` and the rewards read).
        records: the rows themselves, from Python (instead of ``path``).
        tools: tool functions (type hints and a Google-style docstring each), or their import paths.
        environment: TRL's ``environment_factory``: a class or any callable returning an instance (or its import
            path), or a mapping of names to factories, each row routed by its ``environment`` column (not passed to
            ``reset``). One instance per rollout, pooled across batches as TRL pools them; ``reset(**row)`` with the
            whole row before its first turn (text it returns is added to the last message, as TRL); its public
            methods are the tools; its ``get_reward()`` (when its class has one) is added to the rewards.
        rewards: functions (or ``package.module.function`` / ``path/to/file.py:function``) with TRL's signature,
            ``f(prompts, completions, completion_ids, **kwargs) -> list[float | None]``, sync or async, called once
            per batch with every ended episode (``environments``, ``trainer_state``, ``log_metric``, ``log_extra``
            and every other column among the keyword arguments).
        reward_weights: one weight per reward (TRL's ``reward_weights``; an environment's ``get_reward`` weighs 1);
            default: all 1.
        max_turns: assistant turns at most (TRL's ``max_tool_calling_iterations`` + 1); a turn that still calls a
            tool at the limit ends the episode, scored as it stands. null (TRL's default): no limit, chains only;
            ``max_completion_length`` ends each episode (a tree names one width per turn, so it needs a number).
        max_completion_length: TRL's budget for the whole multi-turn completion, in tokens (assistant turns and tool
            messages after the prompt): a turn is cut to what is left, and tool messages that would pass it (or the
            model's context) are dropped, ending the episode with its last assistant turn scored, as TRL does; on
            chains also what ``constant`` aggregation divides each episode by (TRL's dr_grpo). None: only the
            model's context bounds it (``constant`` then divides by ``data.max_new_tokens``).
        chat_template_kwargs: passed to every rendering of the chat template (TRL's, e.g. ``enable_thinking``).
        malformed_turns: a turn whose call cannot be parsed: ``reward`` (TRL) keeps it as text, ends the episode
            and scores it with the rewards; ``penalty`` scores it ``malformed_reward`` and runs no reward.
        malformed_reward: the reward of a malformed turn under ``penalty``, and of an episode whose rewards failed
            (a reward that raises is counted in ``rollout/reward_errors``; TRL would stop the run).
        success_reward: an episode with at least this reward counts as correct (``val/accuracy``).
        tool_timeout: seconds each call may run before it answers an error. With a timeout each rollout's
            environment lives in a worker process of its own, killed at a timeout (the episode then ends), and the
            rewards read it through a proxy; null: the calls run in the training process, unbounded (TRL's).
        tool_messages: ``trl`` (``str(result)``, errors as TRL writes them) or ``json`` (results as JSON, errors
            naming the tools there are).
        check_argument_types: check each call's arguments against its schema's JSON types before calling (TRL:
            no check; the tool's own error answers).
        parallel_sync: run a turn's sync standalone function calls at once (TRL: one after another; environment
            methods always keep call order).
        max_tool_chars: the longest answer the model sees, cut with a note (TRL: no cut; None).
        heldout_size: rows held out, disjoint from training: half validation, half test.
        split_seed: seed of the held-out draw.
        generated_rows: without ``path`` and ``records``, TRL's dataset-free mode: this many rows, each an empty
            user message and its number (``row``), whose environment's ``reset`` makes the prompt. A group's
            episodes share one prompt here (TRL compares different ones), so ``reset`` must give the same text for
            the same row: seed on ``row``.
        mcp_servers: MCP servers whose tools every episode gets beside ``tools`` (each a ``command`` started over
            stdio, or a streamable-HTTP ``url``; docs/guide.md#tools-from-mcp-servers), started once per run at setup;
            each call is bounded by ``tool_timeout`` (which must be set). Needs the ``mcp`` extra.
        turn_rewards: ``off`` (TRL: a call turn scores 0, the episode ends where the model stops calling) or
            ``environment``: after each turn's calls the environment's ``rewards`` list (one entry per step, as
            TRL's OpenReward adapter records it) gives the turn its reward, and ``finished`` ends the episode
            (docs/guide.md#rewards-per-turn); the rewards then score the ended episode on top, and may be none.
    """

    def __init__(self, path: str | None = None, records: Sequence[PromptRecord] | None = None,
                 tools: Sequence[Callable | str] = (), environment: Factory | str | Mapping[str, Factory | str] | None = None,
                 rewards: Sequence[RewardFunction | str] = (), reward_weights: Sequence[float] | None = None,
                 max_turns: int | None = None, max_completion_length: int | None = 256,
                 chat_template_kwargs: Mapping[str, Any] | None = None, malformed_turns: MalformedTurns = "reward",
                 malformed_reward: float = -1.0, success_reward: float = 1.0, tool_timeout: float | None = 10.0,
                 tool_messages: Literal["trl", "json"] = "trl", check_argument_types: bool = False,
                 parallel_sync: bool = False, max_tool_chars: int | None = None, heldout_size: int = 100,
                 split_seed: int = 0, generated_rows: int | None = None,
                 mcp_servers: Sequence[McpServer] | None = None,
                 turn_rewards: Literal["off", "environment"] = "off") -> None:
        super().__init__(use_chat_template=True)
        problems = []
        if path is not None and records is not None:
            problems.append("give path (a data file) or records (rows from Python), not both")
        if path is None and records is None and (environment is None or generated_rows is None):
            problems.append("give path (a data file) or records (rows from Python); without a dataset (the "
                            "environment's reset makes each prompt, TRL's dataset-free mode) give an environment and "
                            "generated_rows")
        if tool_timeout is not None and tool_timeout <= 0:
            problems.append(f"tool_timeout must be positive (seconds), or null to run calls unbounded in the "
                            f"training process; got {tool_timeout}")
        if max_turns is not None and max_turns < 1:
            problems.append(f"max_turns must be >= 1 or null (no limit), got {max_turns}")
        if max_turns is None and max_completion_length is None:
            problems.append("max_turns and max_completion_length are both null: an episode would have no bound; set "
                            "one (TRL bounds a multi-turn completion by max_completion_length)")
        if max_completion_length is not None and max_completion_length < 1:
            problems.append(f"max_completion_length must be >= 1 (tokens) or null, got {max_completion_length}")
        if malformed_turns not in ("reward", "penalty"):
            problems.append(f"malformed_turns must be 'reward' (TRL) or 'penalty', got {malformed_turns!r}")
        if turn_rewards == "environment" and environment is None:
            problems.append("turn_rewards 'environment' reads each turn's reward off the environment: give one")
        if reward_weights is not None and len(reward_weights) != len(rewards):
            problems.append(f"reward_weights has {len(reward_weights)} weight(s) for {len(rewards)} reward(s)")
        problems += server_problems(mcp_servers or (), tool_timeout)
        if problems:
            raise InputError("ToolTask: " + "; ".join(problems))
        self.factories = factories(environment)
        self.path, self.given = path, None if records is None else [dict(r) for r in records]
        self.generated = path is None and records is None
        if self.generated and generated_rows is not None:  # TRL's placeholder rows, numbered
            self.given = [{"prompt": [{"role": "user", "content": ""}], "row": i} for i in range(generated_rows)]
        self.tools = [imported(t) if isinstance(t, str) else t for t in tools]
        self.rewards = [import_reward(r) if isinstance(r, str) else r for r in rewards]  # DatasetTask's reading
        self.weights = [float(w) for w in reward_weights] if reward_weights is not None else [1.0] * len(rewards)
        self.max_turns, self.max_completion_length = max_turns, max_completion_length
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.malformed_turns, self._malformed, self.success_reward = malformed_turns, malformed_reward, success_reward
        self.tool_timeout, self.heldout_size, self.split_seed = tool_timeout, heldout_size, split_seed
        self.kit = ToolKit(self.tools, self.factories, timeout=tool_timeout, messages=tool_messages,
                           check_argument_types=check_argument_types, parallel_sync=parallel_sync,
                           max_chars=max_tool_chars,
                           servers=McpServers(mcp_servers, tool_timeout) if mcp_servers else None)
        self.turn_rewards = turn_rewards
        if not self.rewards and not self.kit.reward_environment_types() and turn_rewards == "off":
            raise InputError("ToolTask: give rewards, or an environment whose class has get_reward() (it then owns "
                             "the reward)")
        self._formats: dict[int, ChatFormat] = {}  # one per tokenizer, as TRL prepares its processing class once

    @property
    def max_rounds(self) -> int | None:
        """An episode's turns at most: ``max_turns`` (None: no limit)."""
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

    def tool_names(self) -> list[str]:
        """Every tool an episode may call, over all environments (the metrics log each by name)."""
        return self.kit.tool_names()

    @property
    def reuses_turn_cache(self) -> bool:
        """A turn's context is the conversation so far, chat template and tools' schemas included: worth the cache."""
        return True

    def format(self, tokenizer: Any) -> ChatFormat:
        """The tokenizer prepared for tool calling as TRL prepares it (``chat_format``), once per tokenizer."""
        if id(tokenizer) not in self._formats:
            self._formats[id(tokenizer)] = chat_format(tokenizer, self.template_kwargs)
        return self._formats[id(tokenizer)]

    def start_episode(self, prompt_record: PromptRecord) -> Episode:
        name = self.environment_of(prompt_record)
        row = dict(prompt_record)  # whole, for the rewards; ToolKit.open leaves a routing column out of reset's
        messages = conversation(prompt_record.get("prompt", ""))
        box, added = self.kit.open(self.reset_row(row, name), name)
        if added:  # TRL: text reset returns is appended to the last message
            messages[-1] = {**messages[-1], "content": appended(messages[-1]["content"], added)}
        return Episode(messages, len(messages), box, tuple(self.kit.schemas(name)), row, name, added)

    def reset_row(self, row: PromptRecord, name: str | None) -> PromptRecord:
        """What ``reset`` is given: the row, less a generated row's number where ``reset`` takes no ``row`` (an
        environment written for TRL's dataset-free mode, whose rows hold only ``prompt``)."""
        if self.generated and "row" in row and not takes_argument(self.kit.probe(name).reset, "row"):
            return {k: v for k, v in row.items() if k != "row"}
        return row

    def environment_of(self, prompt_record: PromptRecord) -> str | None:
        """The row's environment name: its ``environment`` column with a mapping of factories, else None."""
        if not self.factories or (len(self.factories) == 1 and None in self.factories):
            return None
        name = prompt_record.get("environment")
        if name not in self.factories:
            raise RowUnavailable(f"the row's environment {name!r} is not among the environments given "
                                 f"({', '.join(map(str, self.factories))})")
        return name

    def prompt_ids(self, prompt_record: PromptRecord, tokenizer: Any) -> list[int]:
        """The prompt's ids as the engine receives them, the tools' schemas and the template's system text included
        (what ``reset`` adds is known only once an episode starts)."""
        try:
            name = self.environment_of(prompt_record)
        except RowUnavailable as error:
            raise InputError(f"ToolTask: {error}") from None
        messages = conversation(prompt_record.get("prompt", ""))
        return self.format(tokenizer).render(messages, self.kit.schemas(name), generation_prompt=True)

    def episode_prompt_ids(self, prompt_record: PromptRecord, episode: Episode, tokenizer: Any) -> list[int]:
        ids = self.format(tokenizer).render(episode.messages, episode.schemas, generation_prompt=True)
        episode.prompt_length = len(ids)
        return ids

    def branch(self, episode: Any, count: int) -> list[Any]:
        """``count`` children's starting states: the first continues ``episode``'s box, each other gets the
        environment's own copy (``ToolBox.fork``) or a fresh instance replaying the path's calls (``replayed``)."""
        if count <= 1 or not isinstance(episode, Episode):
            return [episode] * count
        copies = []
        for _ in range(count - 1):
            forked = episode.toolbox.fork()
            if forked is not None:
                copies.append(dataclasses.replace(episode.next(), toolbox=forked))
                continue
            try:
                fresh, added = self.kit.open(self.reset_row(episode.row, episode.environment_name),
                                             episode.environment_name)
            except RowUnavailable as error:
                raise InputError(f"a tree branch could not start a second instance of the environment for a row "
                                 f"whose first started ({error})") from None
            copies.append(replayed(episode, fresh, added, self.environment_label(episode)))
        return [episode, *copies]

    def environment_label(self, episode: Episode) -> str:
        environment = episode.environment
        return environment.__class__.__name__ if environment is not None else "of the tools"  # a proxy: its class

    def sequence_budget(self) -> int | None:
        return self.max_completion_length

    def tokens_left(self, episode: Any, context_length: int) -> int | None:
        """The tokens the whole conversation may still take under ``max_completion_length`` after a context of
        ``context_length`` tokens (negative: past it; None: no budget)."""
        if self.max_completion_length is None or not isinstance(episode, Episode):
            return None
        return self.max_completion_length - (context_length - episode.prompt_length)

    def turn(self, prompt_record: PromptRecord, episode: Episode, round_index: int, segment_text: str,
             tokenizer: Any, truncated: bool, segment_ids: Sequence[int] = (),
             context_ids: Sequence[int] = ()) -> EnvStep:
        episode = episode.next()  # the parent's state stays as it was (its node keeps it)
        if not segment_ids:  # the budget left no token: TRL appends no message and the episode ends
            return EnvStep("cut", 0.0, terminal=True, episode=episode, scored_later=True)
        parsed = self.format(tokenizer).parse(segment_ids, context_ids, episode.schemas)
        episode.messages.append(parsed.message)
        episode.malformed = parsed.malformed
        if parsed.malformed and not truncated and self.malformed_turns == "penalty":  # a cut turn is the budget's
            return EnvStep("malformed", self._malformed, terminal=True, episode=episode)
        calls = list(parsed.message.get("tool_calls") or [])
        at_limit = self.max_turns is not None and round_index >= self.max_turns
        seen = steps_taken(episode.environment) if self.turn_rewards == "environment" and calls else None
        label = self.environment_label(episode)
        if truncated and calls and not parsed.malformed and not at_limit:  # TRL runs a cut turn's whole calls,
            counted(episode, episode.toolbox.call_turn(calls))  # then drops their answers with the budget
        if parsed.malformed or not calls or truncated or at_limit:
            kind = "cut" if truncated else "malformed" if parsed.malformed else "answer" if not calls else "cut"
            reward = after_turn(episode.toolbox, seen, label).reward  # the steps of the calls that ran
            return EnvStep(kind, reward, terminal=True, episode=episode, scored_later=True)
        outcomes = episode.toolbox.call_turn(calls)
        counted(episode, outcomes)
        replies = tuple(outcome.message for outcome in outcomes)
        episode.turns = (*episode.turns, TurnCalls(tuple(calls), replies))
        result = after_turn(episode.toolbox, seen, label)  # TurnResult() when off, or the box was lost
        if episode.toolbox.lost:  # a call timed out: its environment is gone, the episode ends as it stands
            return EnvStep("cut", result.reward, terminal=True, episode=episode, scored_later=True)
        if result.finished:  # the environment ended the episode (gym's terminated): its messages close it
            episode.messages.extend(replies)
            return EnvStep("finished", result.reward, terminal=True, episode=episode, scored_later=True)
        formatting = self.format(tokenizer)
        left = self.tokens_left(episode, len(context_ids) + len(segment_ids))
        if left is not None and surely_past(replies, left, formatting.longest_token_bytes):
            return EnvStep("cut", result.reward, terminal=True, episode=episode, scored_later=True)  # untokenized
        reply = ChatReply(tuple(episode.messages), replies, episode.schemas, formatting.chat_template,
                          dict(formatting.template_kwargs))
        episode.messages.extend(replies)
        return EnvStep("call", result.reward, terminal=False, chat_reply=reply, episode=episode)

    def without_reply(self, step: EnvStep) -> EnvStep:
        """``step`` with its tool messages dropped (they would pass the budget or the context): the episode ends
        with its last assistant turn, scored as it stands (TRL's rule)."""
        episode = step.episode.next()
        episode.messages = episode.messages[:len(episode.messages) - len(step.chat_reply.messages)]
        return EnvStep("cut", step.reward, terminal=True, episode=episode, scored_later=True)  # its turn's reward

    def score_episodes(self, episodes: Sequence[Episode], completion_ids: Sequence[Sequence[int]],
                       context: RewardContext | None = None) -> list[EpisodeScore]:
        """Every ended episode of a batch scored in one call per reward (``rewards.score_batch``)."""
        context = context or RewardContext()
        environment_types = self.kit.reward_environment_types()
        rewards = [*self.rewards, *(environment_reward(t) for t in environment_types)]
        names = [*(reward_name(r) for r in self.rewards), *(t.__name__ for t in environment_types)]
        weights = [*self.weights, *[1.0] * len(environment_types)]
        rows = [e.row for e in episodes]
        columns = sorted({k for row in rows for k in row} - {"prompt", "completion", "completion_ids"})
        arguments = {**{k: [row.get(k) for row in rows] for k in columns},
                     "prompts": [e.messages[:e.prompt_messages] for e in episodes],
                     "completions": [e.completion for e in episodes],
                     "completion_ids": [list(ids) for ids in completion_ids]}
        if self.factories:
            arguments["environments"] = [e.environment for e in episodes]
        scores = score_batch(rewards, names, weights, arguments, len(episodes), self.failure_reward, context) \
            if rewards else [EpisodeScore(0.0, {}) for _ in episodes]  # turn rewards alone: their sum is the return
        for episode, score in zip(episodes, scores):
            episode.parts, episode.errors, episode.extra = dict(score.parts), score.errors, dict(score.extra)
        return [dataclasses.replace(s, correct=s.reward is not None and s.reward >= self.success_reward)
                for s in scores]

    def end_episodes(self, episodes: Sequence[Any]) -> None:
        """Give every rollout's environment back to its pool (after the rewards read them)."""
        boxes = {id(e.toolbox): e.toolbox for e in episodes if isinstance(e, Episode) and e.toolbox is not None}
        for box in boxes.values():
            box.release()

    def reward_weights(self) -> dict[str, float]:
        return {reward_name(r): w for r, w in zip(self.rewards, self.weights)}

    def close(self) -> None:
        self.kit.close()


def takes_argument(method: Callable, name: str) -> bool:
    """Whether ``method`` accepts a keyword argument ``name`` (by name, or through ``**kwargs``)."""
    import inspect

    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def surely_past(replies: Sequence[dict[str, Any]], left: int, longest_token: int) -> bool:
    """Whether tool messages this long in bytes pass ``left`` tokens whatever their tokens (none is longer than
    ``longest_token`` bytes): a megabyte answer is dropped without the seconds its tokenization would take."""
    size = sum(len(str(reply.get("content", "")).encode()) for reply in replies)
    return size > (max(left, 0) + 64) * max(longest_token, 1)
