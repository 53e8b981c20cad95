"""Expanding rollout trees round by round, and laying their nodes out as training rows
(docs/guide.md#multi-round-tasks-and-tree-rollouts)."""

from __future__ import annotations

import copy
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from lit_grpo.engines.base import RolloutEngine, SamplingSpec, end_turns
from lit_grpo.run.rules import TREE_BRANCHING, DeclaresRounds
from lit_grpo.run.seeds import derived_seed
from lit_grpo.tasks.base import PromptRecord, prompt_text
from lit_grpo.rollout.turn_tokens import reply_ids
from lit_grpo.errors import InputError
from lit_grpo.tasks.episodes import EnvStep, MultiRoundTask, RowUnavailable
from lit_grpo.tree import SegmentNode, chain_returns, close_with_no_answer, depth_first

class EveryTurn(Sequence[int]):
    """The widths of chains whose task sets no turn limit (a tool task's ``max_turns: null``, TRL's
    ``max_tool_calling_iterations=None``): ``first`` children at the root, then one per turn until every episode has
    ended (the task's token budget ends the longest)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def __len__(self) -> int:
        return sys.maxsize

    def __getitem__(self, index: int) -> int:  # type: ignore[override]
        return self.first if index == 0 else 1

    def __iter__(self) -> Iterator[int]:
        yield self.first
        while True:
            yield 1


def chain_widths(group_size: int, rounds: int | None) -> Sequence[int]:
    """Chains' widths: ``group_size`` episodes per prompt, one child per turn after; ``rounds`` turns at most (None:
    until each ends)."""
    return EveryTurn(group_size) if rounds is None else [group_size] + [1] * (rounds - 1)


def epoch_widths(rollout: str, branching: Sequence[int], group_size: int, task: Any) -> Sequence[int]:
    """An epoch's widths per round: a tree's ``branching``; chains' ``group_size`` then one per turn, up to the
    task's turn limit (``turn_limit``)."""
    return branching if rollout == "tree" else chain_widths(group_size, turn_limit(task, branching))


def turn_limit(task: Any, branching: Sequence[int]) -> int | None:
    """The turns a chain (or a greedy episode) runs at most: the task's ``max_rounds`` where it declares them (a
    tool task's ``max_turns``; None: no limit, its token budget ends each episode), else a tree's ``branching``'s
    length (a tree names one width per round the task runs: ``run/rules.py``)."""
    return task.max_rounds if isinstance(task, DeclaresRounds) else len(branching)


def grown_rounds(widths: Sequence[int]) -> int | None:
    """The rounds a batch of trees could run: ``widths``' length; None where there is no limit (a rank's deepest
    episode would differ between ranks, and so would the per-round figures named after it)."""
    return None if isinstance(widths, EveryTurn) else len(widths)


Decide = Callable[[list[list[int]], int], Sequence["tuple[int, ...] | None"]]
"""A decision rule: for the open contexts of round ``depth``, each one's allowed first tokens (None: free)."""


def expand_trees(
    task: MultiRoundTask,
    engine: RolloutEngine,
    tokenizer: Any,
    records: Sequence[PromptRecord],
    branching: Sequence[int],
    sampling: SamplingSpec,
    decide: Decide | None = None,
    request_offset: int = 0,
    reward_context: Any = None,
) -> list[SegmentNode]:
    """One tree per prompt, ``len(branching)`` rounds deep; round d gives every open node ``branching[d-1]``
    children, all open nodes of all trees in one engine call. A question still open after the last round is
    closed by the environment with the task's no-answer reward. ``decide`` (the risk rule) restricts the first
    token of some open nodes' children; the restriction is kept on each child for the trainer. Episodes a task
    scores once the batch has ended (a tool task's) are scored then, in one call (``reward_context``: what its
    rewards are given of the run), and what they hold is released."""
    roots = started_roots(task, tokenizer, records)
    try:
        ended = grow_rounds(task, engine, tokenizer, roots, branching, sampling, decide, request_offset)
        score_ended(task, roots, ended, reward_context)
    finally:
        end_turns(engine)  # episodes that all ended early, or an error: nothing kept for a turn that never comes
        task.end_episodes([node.episode for root in roots for node in depth_first(root)
                           if isinstance(node, SegmentNode) and node.episode is not None])
    return roots


def grow_rounds(task: MultiRoundTask, engine: RolloutEngine, tokenizer: Any, roots: list[SegmentNode],
                branching: Sequence[int], sampling: SamplingSpec, decide: Decide | None,
                request_offset: int) -> list[SegmentNode]:
    """``expand_trees``' rounds: every open node of every tree gets its round's children in one engine call.
    Returns the nodes whose episodes ended awaiting their score (``EnvStep.scored_later``)."""
    open_nodes: list[SegmentNode] = list(roots)
    ended: list[SegmentNode] = []
    for depth, width in enumerate(branching, start=1):
        if not open_nodes:
            break
        contexts = [list(node.context + node.segment + node.reply) for node in open_nodes]
        # round d's base seed, then the index of these prompts among the epoch's (a rank's share, the rule's trees)
        round_seed = None if sampling.seed is None else derived_seed(sampling.seed, "round", depth) + request_offset
        # another turn follows and the task's contexts are worth the cache (``reuses_turn_cache``: a chat task's):
        # the engine may keep these rows' cache for it (the hf engine does). The games' prompts are a few ids, and
        # their runs keep their numbers to the last bit (a relaid cache rounds otherwise: 1e-5 on an adapter)
        next_turn = depth < len(branching) and task.reuses_turn_cache
        round_sampling = replace(sampling, seed=round_seed, next_turn=next_turn)
        constraints = tuple(decide(contexts, depth)) if decide is not None else (None,) * len(contexts)
        if any(c is not None for c in constraints):
            round_sampling = replace(round_sampling, allowed_token_ids=constraints)
        groups = engine.generate(contexts, width, round_sampling)
        next_open = []
        for parent, context, completions, allowed in zip(open_nodes, contexts, groups, constraints):
            starts = task.branch(parent.episode, len(completions))  # each child's own state (a tree's copies)
            for completion, start in zip(completions, starts):
                child, later = segment_child(task, tokenizer, parent, start, depth, context, completion,
                                             sampling.context_limit)
                child.allowed = allowed
                parent.children.append(child)
                if later:
                    ended.append(child)
                if not child.terminal:
                    next_open.append(child)
        open_nodes = next_open
    for node in open_nodes:  # cut off at max_depth
        close_with_no_answer(node, task.no_answer_reward)
    return ended


def score_ended(task: MultiRoundTask, roots: Sequence[SegmentNode], ended: Sequence[SegmentNode],
                reward_context: Any) -> None:
    """The rewards of the episodes that ended awaiting them, in one call: each node's reward (added to what its
    environment gave the turn) and correctness; an episode no reward applied to is unscorable (``scorable`` False:
    its chain's advantage is 0)."""
    if not ended:
        return
    starts = {id(node): len(root.context) for root in roots for node in depth_first(root)}
    completion_ids = [list(node.context[starts[id(node)]:] + node.segment) for node in ended]
    scores = task.score_episodes([node.episode for node in ended], completion_ids, reward_context)
    unscorable, failed = 0, []
    for node, score in zip(ended, scores):
        node.scorable = score.reward is not None
        node.reward += score.reward if score.reward is not None else 0.0  # after its turn's own (turn_rewards)
        node.correct = score.correct
        node.reward_error = score.errors[0] if score.errors else None
        unscorable += not node.scorable
        failed += [f"{error} (prompt {prompt_text(node.record)!r:.60})" for error in score.errors[:1]]
    if failed:  # one warning per batch, with the first distinct messages
        distinct = list(dict.fromkeys(failed))
        warnings.warn(f"reward error on {len(failed)} of {len(ended)} episode(s), scored {task.failure_reward} "
                      f"(rollout/reward_errors): " + "; ".join(distinct[:3]), stacklevel=2)
    if unscorable:
        warnings.warn(f"{unscorable} of {len(ended)} episode(s) were scored by no reward (every reward returned "
                      "None for them): they carry no learning signal (advantage 0); check the rewards' columns",
                      stacklevel=2)


def started_roots(task: MultiRoundTask, tokenizer: Any, records: Sequence[PromptRecord]) -> list[SegmentNode]:
    """One root per record whose episode starts; a record whose episode cannot (``RowUnavailable``: an environment's
    ``reset`` raised) is skipped with one warning for the batch. None starting is the task's error to fix."""
    roots, skipped = [], []
    for record in records:
        try:
            episode = task.start_episode(copy.deepcopy(record))  # the environment is user code: it gets a copy
        except RowUnavailable as error:
            skipped.append(str(error))
            continue
        roots.append(SegmentNode(context=tuple(task.episode_prompt_ids(record, episode, tokenizer)), record=record,
                                 episode=episode))
    if skipped and not roots:
        raise InputError(f"every one of {len(records)} rows failed to start its episode (the environment's reset "
                         f"raised; first: {skipped[0]}): fix the environment or the rows")
    if skipped:
        warnings.warn(f"skipped {len(skipped)} of {len(records)} rows whose environment reset raised (first: "
                      f"{skipped[0]}); the run goes on without them", stacklevel=2)
    return roots


def segment_child(task: MultiRoundTask, tokenizer: Any, parent: SegmentNode, episode: Any, depth: int,
                  context: list[int], completion: Any, context_limit: int | None) -> tuple[SegmentNode, bool]:
    """The node for one generated segment, scored by the environment from ``episode`` (this child's state); a
    continuing one carries the reply's ids. A segment past the episode's whole budget is cut to it; a reply that
    would pass the budget or the model's context is dropped and the episode ends (the task's ``without_reply``).
    Returns the node and whether its score comes once the batch has ended."""
    ids, logprobs, truncated = list(completion.token_ids), list(completion.logprobs or ()), \
        completion.finish_reason == "length"
    left = task.tokens_left(episode, len(context))
    if left is not None and len(ids) > max(left, 0):  # TRL cuts a turn to what the whole budget leaves
        ids, logprobs, truncated = ids[:max(left, 0)], logprobs[:max(left, 0)], True
    text = tokenizer.decode(ids, skip_special_tokens=True)
    # the environment is user code: it gets a copy of the record
    step = task.turn(copy.deepcopy(parent.record), episode, depth, text, tokenizer, truncated, segment_ids=ids,
                     context_ids=context)
    reply = reply_tokens(tokenizer, step, ids, depth)
    if not step.terminal and overflows(task, step.episode, len(context) + len(ids) + len(reply), context_limit):
        step, reply = task.without_reply(step), ()
    node = SegmentNode(
        reward=step.reward, terminal=step.terminal, context=tuple(context), segment=tuple(ids),
        logprobs=tuple(logprobs), reply=tuple(reply), kind=step.kind, correct=step.correct, truncated=truncated,
        record=parent.record, episode=step.episode,
    )
    return node, step.scored_later


def overflows(task: MultiRoundTask, episode: Any, length: int, context_limit: int | None) -> bool:
    """Whether a context of ``length`` tokens passes the episode's budget or reaches the model's context (TRL's
    rule for tool results: ``len > max_completion_length`` after the prompt, or ``>= max_model_len``)."""
    left = task.tokens_left(episode, length)
    return (left is not None and left < 0) or (context_limit is not None and length >= context_limit)


def reply_tokens(tokenizer: Any, step: EnvStep, segment: Sequence[int], depth: int) -> tuple[int, ...]:
    """The reply's ids: a chat reply rendered by the template after the turn's last sampled token (the token rule,
    ``turn_tokens``), a text reply tokenized alone (the games), none after a terminal segment."""
    if step.terminal:
        return ()
    if step.chat_reply is not None:
        reply = step.chat_reply
        return tuple(reply_ids(tokenizer, reply.conversation, reply.messages, reply.tools,
                               end_of_turn=segment[-1] if segment else -1, turn=depth,
                               chat_template=reply.chat_template, template_kwargs=reply.template_kwargs))
    return tuple(tokenizer(step.reply, add_special_tokens=False)["input_ids"])


def greedy_episodes(
    task: MultiRoundTask,
    engine: RolloutEngine,
    tokenizer: Any,
    records: Sequence[PromptRecord],
    max_depth: int | None,
    sampling: SamplingSpec,
    decide: Decide | None = None,
    reward_context: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One greedy episode per prompt: ``(returns [B], correct [B])``, correct meaning it ended in a right answer."""
    roots = greedy_trees(task, engine, tokenizer, records, max_depth, sampling, decide, reward_context)
    returns, correct = [], []
    for root in roots:
        (episode_return,) = chain_returns(root)
        returns.append(episode_return)
        last = depth_first(root)[-1]
        correct.append(bool(getattr(last, "correct", False)))
    return torch.tensor(returns), torch.tensor(correct)


def greedy_trees(
    task: MultiRoundTask,
    engine: RolloutEngine,
    tokenizer: Any,
    records: Sequence[PromptRecord],
    max_depth: int | None,
    sampling: SamplingSpec,
    decide: Decide | None = None,
    reward_context: Any = None,
) -> list[SegmentNode]:
    """One greedy episode per prompt, as single-path trees (``max_depth`` None: until each ends)."""
    widths = chain_widths(1, max_depth)
    return expand_trees(task, engine, tokenizer, records, widths, replace(sampling, greedy=True), decide,
                        reward_context=reward_context)


def grow_epoch_trees(task: MultiRoundTask, engine: RolloutEngine, tokenizer: Any, records: list[PromptRecord],
                     widths: list[int], sampling: SamplingSpec, rule: Decide | None, explore_fraction: float,
                     start: int, reward_context: Any = None) -> list[SegmentNode]:
    """An epoch's trees of ``records`` (this rank's, from prompt ``start`` of the epoch's); with the risk ``rule``, the
    first ``explore_fraction`` of them grow without it, so the head keeps seeing outcomes of inferring where the rule
    would forbid it. The rule's trees continue the exploring trees' request seeds."""
    free = 0 if rule is None else round(len(records) * explore_fraction)
    roots = [] if not free else expand_trees(task, engine, tokenizer, records[:free], widths, sampling,
                                             request_offset=start, reward_context=reward_context)
    if free < len(records):
        roots += expand_trees(task, engine, tokenizer, records[free:], widths, sampling, rule,
                              request_offset=start + free, reward_context=reward_context)
    return roots
