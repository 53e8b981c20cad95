"""Greedy probe episodes that label decision states for the detached risk head.

The rules run greedily, so the head is trained on what greedy play earns: from each probe prompt, the plain greedy
episode; then, at the state where it answered, the same episode with a defer forced there (the return of
deferring, and the states a forced defer leads to); and at each state where it asked, the same episode with an
answer forced there (the return of inferring where the policy would not). Greedy play is deterministic, so a
forced episode passes through the plain one's states up to the forced round. Every policy segment of every probe
labels its context: an answer (free or forced) with its reward as a return of inferring; a question (free or
forced, even one that went astray) with the return from there on as a return of deferring.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lit_grpo.tasks.base import PromptRecord, Task
from lit_grpo.tree import SegmentNode, depth_first


@dataclass
class ProbeLabels:
    """Labelled decision states: ``contexts`` (token ids), ``infer_returns`` and ``defer_returns`` ``[M]`` (NaN
    where that branch was not played from the state)."""

    contexts: list[tuple[int, ...]]
    infer_returns: torch.Tensor  # [M]
    defer_returns: torch.Tensor  # [M]


class Forcing:
    """A decision rule that restricts the first token at given ``(round, context)`` pairs and leaves the rest free."""

    def __init__(self, forced: dict[tuple[int, tuple[int, ...]], tuple[int, ...]]) -> None:
        self.forced = forced

    def __call__(self, contexts: list[list[int]], depth: int) -> list[tuple[int, ...] | None]:
        return [self.forced.get((depth, tuple(context))) for context in contexts]


def episode_labels(root: SegmentNode, defer_ids: Sequence[int]) -> list[tuple[tuple[int, ...], float, float]]:
    """``(context, return of inferring or NaN, return of deferring or NaN)`` for each policy segment of a greedy
    episode (a single-path tree); a question's return counts every reward from it on, the no-answer closing too."""
    path = depth_first(root)[1:]
    labels = []
    for index, node in enumerate(path):
        if not getattr(node, "segment", ()):  # the environment's no-answer closing: no decision
            continue
        deferred = node.kind == "ask" or node.allowed == tuple(defer_ids)
        if deferred:
            labels.append((node.context, math.nan, sum(n.reward for n in path[index:])))
        else:
            labels.append((node.context, node.reward, math.nan))
    return labels


def probe_records(task: Task, epoch_records: Sequence[PromptRecord], cursor: int, count: int) -> list[PromptRecord]:
    """The epoch's prompts, then the training prompts from ``cursor`` on, ``count`` in all (fewer if the epoch's
    are more)."""
    train = task.train_records()
    return list(epoch_records) + [train[(cursor + i) % len(train)] for i in range(count - len(epoch_records))]
