"""Why one rollout shape learns faster: how reliably one epoch's advantages rank the first decision of an episode.

For each held-out prompt the warm-start model is rolled out ``reps`` times (fresh samples each time) the way a
variant rolls out (a tree ``[4, 2, 2]`` or 8 chains ``[8, 1, 1]``) and the variant's advantages are computed. The
estimate behind the first decision is ``d = mean A(first segments that ask) - mean A(first segments that answer)``
(defined when both kinds were sampled): positive means "ask here". Reported per variant:

- ``agreement``: the share of estimates whose sign is the oracle's choice at that prompt (ask iff
  ``task.oracle_questions(prompt) > 0``): how often one epoch's signal points the right way;
- ``snr``: the median over prompts of ``|mean d| / std d`` across repetitions (the per-decision advantage's
  signal against its sampling noise; scale-free, so the tree and chain normalisers compare);
- ``defined``: the share of rollouts in which both kinds were sampled at the first round;
- ``episodes_per_decision``: the mean number of finished episodes below each first segment (1 for a chain);
- ``segments``: policy segments generated per prompt (the cost of one estimate).

PPO's advantages need a trained value head, so it has no row here.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import torch

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.rollout.trees import expand_trees
from lit_grpo.tree import leaf_counts, policy_nodes, tree_row_advantages

SHAPES = {  # variant: (rollout kind, widths per round by the game's rounds, value mode, std scope)
    "tree-mean": ("tree", {3: [4, 2, 2], 4: [4, 2, 2, 2]}, "mean", "tree"),
    "tree-optimal-stopping": ("tree", {3: [4, 2, 2], 4: [4, 2, 2, 2]}, "optimal_stopping", "tree"),
    "tree-os-sibling-std": ("tree", {3: [4, 2, 2], 4: [4, 2, 2, 2]}, "optimal_stopping", "siblings"),
    # the 8-wide answers at the last round where an answer can still be wrong (issue 49)
    "tree-wide-answers": ("tree", {3: [2, 2, 8], 4: [2, 2, 8, 1]}, "optimal_stopping", "tree"),
    "chains-grpo": ("chains", {3: [8, 1, 1], 4: [8, 1, 1, 1]}, "mean", "tree"),
}


def widths_for(widths: dict[int, list[int]], rounds: int) -> list[int]:
    """A shape's widths for a game of ``rounds`` rounds, one per round as written (nothing is stretched)."""
    if rounds not in widths:
        raise ValueError(f"no widths written for a {rounds}-round game: {widths}")
    return widths[rounds]


def first_decision(root: Any) -> float | None:
    """``mean A(asking first segments) - mean A(answering ones)``, None unless both kinds are there."""
    by_kind: dict[str, list[float]] = {"ask": [], "answer": []}
    for child in root.children:
        if child.kind in by_kind:
            by_kind[child.kind].append(child.advantage)
    if not by_kind["ask"] or not by_kind["answer"]:
        return None
    return statistics.fmean(by_kind["ask"]) - statistics.fmean(by_kind["answer"])


def decision_signal(model: str, task: Any, variant: str, prompts: int = 40, reps: int = 8,
                    rounds: int = 3) -> dict[str, float]:
    """The figures above for one variant on the first ``prompts`` held-out prompts of a ``rounds``-round game."""
    kind, widths, value_mode, std_scope = SHAPES[variant]
    widths = widths_for(widths, rounds)
    tokenizer = load_tokenizer(model)
    engine = HFEngine()
    engine.push_policy(load_policy(model, 16, 32, 0.0, "all-linear", dtype="float32"))
    records = list(task.heldout_records())[:prompts]
    spec = SamplingSpec(max_new_tokens=5, stop_token_ids=(tokenizer.eos_token_id,))
    estimates: list[list[float | None]] = [[] for _ in records]
    below, segments = [], []
    for rep in range(reps):
        with torch.no_grad():
            roots = expand_trees(task, engine, tokenizer, records, widths, replace(spec, seed=1000 + rep))
        tree_row_advantages(SimpleNamespace(tree_mode=kind, trees=roots), "grpo", value_mode, std_scope)
        for index, root in enumerate(roots):
            estimates[index].append(first_decision(root))
            counts = leaf_counts(root)
            below.extend(counts[child] for child in root.children)
            segments.append(len(policy_nodes(root)))
    agree, defined, snrs = [], [], []
    for record, values in zip(records, estimates):
        ask = task.oracle_questions(record) > 0
        present = [d for d in values if d is not None]
        defined.extend(d is not None for d in values)
        agree.extend((d > 0) == ask for d in present if d != 0)
        if len(present) >= 3:
            spread = statistics.stdev(present)
            snrs.append(abs(statistics.fmean(present)) / spread if spread > 0 else float("inf"))
    return {"agreement": statistics.fmean(agree) if agree else float("nan"),
            "snr": statistics.median(snrs) if snrs else float("nan"),
            "defined": statistics.fmean(defined), "episodes_per_decision": statistics.fmean(below),
            "segments": statistics.fmean(segments)}
