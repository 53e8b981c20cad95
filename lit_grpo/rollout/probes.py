"""Drawing the greedy probe episodes that label decision states for the detached risk head (``lit_grpo.risk.probes``
says what is drawn and how each state is labelled)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from lit_grpo.engines.base import RolloutEngine, SamplingSpec
from lit_grpo.risk.probes import Forcing, ProbeLabels, episode_labels
from lit_grpo.rollout.trees import greedy_trees
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask
from lit_grpo.tree import depth_first


def probe_labels(task: AskOrAnswerTask, engine: RolloutEngine, tokenizer: Any, records: Sequence[PromptRecord],
                 max_depth: int, sampling: SamplingSpec) -> ProbeLabels:
    """The plain and forced greedy episodes of ``records`` (see the module docstring), labelled."""
    defer_ids, answer_ids = tuple(task.defer_token_ids(tokenizer)), tuple(task.answer_token_ids(tokenizer))
    plain = greedy_trees(task, engine, tokenizer, records, max_depth, sampling)
    answered: dict[tuple[int, tuple[int, ...]], tuple[int, ...]] = {}
    answered_records = []
    asked_by_round: list[tuple[list[PromptRecord], dict]] = [([], {}) for _ in range(max_depth)]
    for record, root in zip(records, plain):
        for depth, node in enumerate(depth_first(root)[1:], start=1):
            if not getattr(node, "segment", ()):
                continue
            if node.kind == "ask":  # force an answer here instead, one round per batch (a record asks in several)
                chosen, forced = asked_by_round[depth - 1]
                chosen.append(record)
                forced[(depth, node.context)] = answer_ids
            else:  # it answered here: force a question instead
                answered_records.append(record)
                answered[(depth, node.context)] = defer_ids
    batches = [(answered_records, answered), *asked_by_round]
    roots = list(plain)
    for chosen, forced in batches:
        if chosen:
            roots += greedy_trees(task, engine, tokenizer, chosen, max_depth, sampling, Forcing(forced))
    # a prompt's state met in several of its probes (a forced episode replays the plain one's start) is one row with
    # both branches; the same context of two prompts (both operands hidden) is two rows: their outcomes differ
    position = {id(record): index for index, record in enumerate(records)}
    merged: dict[tuple[int, tuple[int, ...]], list[float]] = {}
    for root in roots:
        for context, infer, defer in episode_labels(root, defer_ids):
            row = merged.setdefault((position[id(root.record)], context), [math.nan, math.nan])
            row[0] = infer if math.isnan(row[0]) else row[0]
            row[1] = defer if math.isnan(row[1]) else row[1]
    values = torch.tensor(list(merged.values()), dtype=torch.float32).reshape(-1, 2)  # [M, 2]
    return ProbeLabels([context for _, context in merged], values[:, 0], values[:, 1])
