"""Expanding rollout trees round by round, and laying their nodes out as training rows
(docs/guide.md#multi-round-tasks-and-tree-rollouts)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from lit_grpo.buffers.tree_layout import SegmentNode, chain_returns
from lit_grpo.engines.base import RolloutEngine, SamplingSpec, end_turns
from lit_grpo.run.seeds import derived_seed
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.rollout.turn_tokens import reply_ids
from lit_grpo.errors import InputError
from lit_grpo.tasks.multiround import EnvStep, MultiRoundTask, RowUnavailable
from lit_grpo.tree import close_with_no_answer, depth_first

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
) -> list[SegmentNode]:
    """One tree per prompt, ``len(branching)`` rounds deep; round d gives every open node ``branching[d-1]``
    children, all open nodes of all trees in one engine call. A question still open after the last round is
    closed by the environment with the task's no-answer reward. ``decide`` (the risk rule) restricts the first
    token of some open nodes' children; the restriction is kept on each child for the trainer."""
    roots = started_roots(task, tokenizer, records)
    try:
        grow_rounds(task, engine, tokenizer, roots, branching, sampling, decide, request_offset)
    finally:
        end_turns(engine)  # episodes that all ended early, or an error: nothing kept for a turn that never comes
    return roots


def grow_rounds(task: MultiRoundTask, engine: RolloutEngine, tokenizer: Any, roots: list[SegmentNode],
                branching: Sequence[int], sampling: SamplingSpec, decide: Decide | None, request_offset: int) -> None:
    """``expand_trees``' rounds: every open node of every tree gets its round's children in one engine call."""
    open_nodes: list[SegmentNode] = list(roots)
    for depth, width in enumerate(branching, start=1):
        if not open_nodes:
            break
        contexts = [list(node.context + node.segment + node.reply) for node in open_nodes]
        # round d's base seed, then the index of these prompts among the epoch's (a rank's share, the rule's trees)
        round_seed = None if sampling.seed is None else derived_seed(sampling.seed, "round", depth) + request_offset
        # another turn of a chat task follows: the engine may keep these rows' cache for it (the hf engine does).
        # The games' prompts are a few ids, whose prefill costs nothing, and their runs keep their numbers to the
        # last bit (a relaid cache rounds otherwise in the last bits: 1e-5 on an adapter after an epoch)
        next_turn = depth < len(branching) and task.owns_turns
        round_sampling = replace(sampling, seed=round_seed, next_turn=next_turn)
        constraints = tuple(decide(contexts, depth)) if decide is not None else (None,) * len(contexts)
        if any(c is not None for c in constraints):
            round_sampling = replace(round_sampling, allowed_token_ids=constraints)
        groups = engine.generate(contexts, width, round_sampling)
        next_open = []
        for parent, context, completions, allowed in zip(open_nodes, contexts, groups, constraints):
            for completion in completions:
                child = segment_child(task, tokenizer, parent, depth, context, completion)
                child.allowed = allowed
                parent.children.append(child)
                if not child.terminal:
                    next_open.append(child)
        open_nodes = next_open
    for node in open_nodes:  # cut off at max_depth
        close_with_no_answer(node, task.no_answer_reward)


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


def segment_child(
    task: MultiRoundTask, tokenizer: Any, parent: SegmentNode, depth: int, context: list[int], completion: Any
) -> SegmentNode:
    """The node for one generated segment, scored by the environment; a continuing one carries the reply's ids."""
    text = tokenizer.decode(list(completion.token_ids), skip_special_tokens=True)
    truncated = completion.finish_reason == "length"
    # the environment is user code: it gets a copy of the record
    step = task.turn(copy.deepcopy(parent.record), parent.episode, depth, text, tokenizer, truncated)
    return SegmentNode(
        reward=step.reward, terminal=step.terminal, context=tuple(context), segment=tuple(completion.token_ids),
        logprobs=tuple(completion.logprobs or ()), reply=reply_tokens(tokenizer, step, completion, depth),
        kind=step.kind, correct=step.correct, truncated=truncated, record=parent.record, episode=step.episode,
    )


def reply_tokens(tokenizer: Any, step: EnvStep, completion: Any, depth: int) -> tuple[int, ...]:
    """The reply's ids: a chat reply rendered by the template after the turn's last sampled token (the token rule,
    ``turn_tokens``), a text reply tokenized alone (the games), none after a terminal segment."""
    if step.terminal:
        return ()
    if step.chat_reply is not None:
        reply = step.chat_reply
        return tuple(reply_ids(tokenizer, reply.conversation, reply.messages, reply.tools,
                               end_of_turn=completion.token_ids[-1], turn=depth))
    return tuple(tokenizer(step.reply, add_special_tokens=False)["input_ids"])


def greedy_episodes(
    task: MultiRoundTask,
    engine: RolloutEngine,
    tokenizer: Any,
    records: Sequence[PromptRecord],
    max_depth: int,
    sampling: SamplingSpec,
    decide: Decide | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One greedy episode per prompt: ``(returns [B], correct [B])``, correct meaning it ended in a right answer."""
    roots = greedy_trees(task, engine, tokenizer, records, max_depth, sampling, decide)
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
    max_depth: int,
    sampling: SamplingSpec,
    decide: Decide | None = None,
) -> list[SegmentNode]:
    """One greedy episode per prompt, as single-path trees."""
    return expand_trees(task, engine, tokenizer, records, [1] * max_depth, replace(sampling, greedy=True), decide)


def grow_epoch_trees(task: MultiRoundTask, engine: RolloutEngine, tokenizer: Any, records: list[PromptRecord],
                     widths: list[int], sampling: SamplingSpec, rule: Decide | None, explore_fraction: float,
                     start: int) -> list[SegmentNode]:
    """An epoch's trees of ``records`` (this rank's, from prompt ``start`` of the epoch's); with the risk ``rule``, the
    first ``explore_fraction`` of them grow without it, so the head keeps seeing outcomes of inferring where the rule
    would forbid it. The rule's trees continue the exploring trees' request seeds."""
    free = 0 if rule is None else round(len(records) * explore_fraction)
    roots = [] if not free else expand_trees(task, engine, tokenizer, records[:free], widths, sampling,
                                             request_offset=start)
    if free < len(records):
        roots += expand_trees(task, engine, tokenizer, records[free:], widths, sampling, rule,
                              request_offset=start + free)
    return roots
