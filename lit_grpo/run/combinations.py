"""Which features work with which rollout kind, as data, checked once before any model loads (issue 18, bug 2).

Grouped rollouts (G completions of one prompt) carry every loss and sampling feature; tree and chain rollouts
(multi-round episodes scored by an environment) carry tree-relative advantages and the risk head. A feature set
with a rollout kind that does not implement it was silently ignored or failed after the first generation; here it
is refused by name. ``tests/test_combinations.py`` runs or refuses every row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLLOUTS = ("grouped", "tree", "chains")


@dataclass(frozen=True)
class Feature:
    knob: str  # "model.<arg>" or "data.<arg>"
    is_on: Callable[[Any], bool]  # whether the knob's value turns the feature on
    rollouts: tuple[str, ...]  # the rollout kinds that implement it
    why: str  # what the other kinds lack


FEATURES: tuple[Feature, ...] = (
    Feature("model.loss_variant", lambda v: v == "dpo", ("grouped",),
            "online DPO pairs the best and worst completion of one prompt's group"),
    Feature("model.advantage_mode", lambda v: v == "gae", ("grouped", "chains"),
            "PPO's value head and GAE run along one trajectory per row or chain; a tree's branches share their "
            "ancestors, and trees use tree-relative advantages"),
    Feature("model.tree_std_scope", lambda v: v == "siblings", ("tree",),
            "only a tree has sibling groups: each decision's alternatives sampled from one context"),
    Feature("model.kl_in", lambda v: v == "reward", ("grouped",),
            "the KL penalty is folded into the reward of a single-round completion"),
    Feature("model.tis_cap", lambda v: v is not None, ("grouped",),
            "the truncated importance-sampling correction is applied to grouped rollouts' sampler log-probs"),
    Feature("data.dynamic_sampling", bool, ("grouped",), "dynamic sampling redraws prompts whose group is flat"),
    Feature("data.mask_truncated", bool, ("grouped",), "overlong filtering masks grouped completions"),
    Feature("data.overlong_cache", lambda v: v is not None, ("grouped",),
            "the overlong penalty is added to a single-round completion's reward"),
    Feature("data.reward_timeout", lambda v: v is not None, ("grouped",),
            "reward isolation wraps the task's reward, which tree and chain rollouts do not call (their environment "
            "scores each round)"),
    Feature("model.risk", lambda v: v is not None, ("tree", "chains"),
            "the risk head learns at the infer/defer decisions of multi-round rollouts"),
)


def combination_problems(model_args: dict[str, Any] | None, data_args: dict[str, Any]) -> list[str]:
    """One message per feature that is on with a rollout kind that does not implement it; ``model_args`` None
    checks the data's own features only (the DataModule alone, before it meets a module)."""
    rollout = data_args["rollout"]
    if rollout not in ROLLOUTS:
        return []  # reported as an unknown value
    problems = []
    for feature in FEATURES:
        section, name = feature.knob.split(".")
        args = model_args if section == "model" else data_args
        if args is None or name not in args:
            continue
        value = args[name]
        if feature.is_on(value) and rollout not in feature.rollouts:
            problems.append(f"{feature.knob} {value!r} with data.rollout {rollout!r}: {feature.why}; it takes "
                            f"data.rollout {' or '.join(repr(r) for r in feature.rollouts)}")
    return problems
