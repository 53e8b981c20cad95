"""The rules among ``PolicyModule``'s own knobs (one part's rules, beside ``objective.py``; the rules across parts
are ``lit_grpo.run.rules``'): which loss takes which aggregation, ratio, advantages, knobs and corrections, each read
off the variant's row (``lit_grpo.losses.variants``), and the advantage modes' pairings. A knob that would do nothing
with the others is refused by name. ``PolicyModule.config_problems`` runs them, so the command reports them before
any weights load (as ``model.<message>``) and the module refuses them when it is built."""

from __future__ import annotations

import dataclasses
from typing import Any

from lit_grpo.losses.variants import VARIANTS, LossVariant
from lit_grpo.policy.knob_groups import group

# turn credit -> the advantage modes that say its baseline and scale (turn_credit 'episode' takes every mode)
TURN_CREDIT_MODES = {"reward_to_go": ("rloo",), "per_turn_index": ("grpo", "centered", "drgrpo")}
TURN_CREDIT_WHY = {"reward_to_go": "its baseline is the leave-one-out mean of the other episodes' reward-to-go",
                   "per_turn_index": "grpo divides each turn index's centred rewards by their std, centered and "
                                     "drgrpo do not"}
# the knobs' names before model.loss_knobs (deprecated): each is read by the variant of its name only
FLAT_KNOBS = ("sapo", "vespo")


def module_knob_problems(model_args: dict[str, Any]) -> list[str]:
    """The rules among PolicyModule's own knobs."""
    variant, mode = model_args["loss_variant"], model_args["advantage_mode"]
    row = VARIANTS.get(variant)
    problems = [] if row is None else surrogate_knob_problems(model_args, variant, row)
    aggregation = model_args.get("aggregation")
    if row is not None and row.aggregation_required and aggregation not in (None, row.aggregation):
        problems.append(f"aggregation: loss_variant {variant!r} takes {row.aggregation!r} only, got {aggregation!r}")
    if row is not None and row.per_sequence_advantage and mode == "gae":
        problems.append(f"advantage_mode: 'gae' gives per-token advantages, which {variant} does not take (it "
                        "weighs a sequence by one advantage); use another advantage_mode or loss_variant")
    if variant == "dpo":
        problems += dpo_problems(model_args)
    kl = group(model_args, "kl")
    if mode == "gdpo" and kl.applied_to == "reward" and kl.coef > 0:
        problems.append("advantage_mode 'gdpo' with model.kl.applied_to 'reward': GDPO normalises each of the task's "
                        "rewards apart, and the KL penalty is none of them; use kl.applied_to 'loss'")
    credit = model_args.get("turn_credit", "episode")
    wanted_modes = TURN_CREDIT_MODES.get(credit, (mode,))
    if mode not in wanted_modes:
        problems.append(f"turn_credit {credit!r} with advantage_mode {mode!r}: it takes advantage_mode "
                        f"{' or '.join(repr(m) for m in wanted_modes)} ({TURN_CREDIT_WHY[credit]})")
    if mode == "gdpo" and model_args.get("std_scope") == "batch":
        problems.append("std_scope 'batch' with advantage_mode 'gdpo': GDPO normalises within each group and "
                        "then over the batch already; leave std_scope 'group'")
    if kl.ratio_correction and not (kl.coef > 0 and kl.applied_to == "loss"):
        problems.append("kl.ratio_correction: it corrects the KL term of the loss, which needs kl.coef > 0 and "
                        "kl.applied_to 'loss'")
    return problems


def surrogate_knob_problems(model_args: dict[str, Any], variant: str, row: LossVariant) -> list[str]:
    """The surrogate's own knobs set where the variant's row says it does not read them."""
    problems = []
    level = model_args.get("ratio_level")
    if level is not None and level not in row.ratio_levels:
        choosers = [name for name, other in VARIANTS.items() if len(other.ratio_levels) > 1]
        fixed = "; ".join(f"{name}'s is the {other.ratio_levels[0]}'s" for name, other in VARIANTS.items()
                          if len(other.ratio_levels) == 1)
        none = " and ".join(name for name, other in VARIANTS.items() if not other.ratio_levels)
        problems.append(f"ratio_level {level!r} with loss_variant {variant!r}: only {', '.join(choosers)} choose "
                        f"their ratio's level ({fixed}; {none} take none); leave it unset")
    if group(model_args, "clip").delta is not None and not row.clips:
        clippers = ", ".join(name for name, other in VARIANTS.items() if other.clips)
        problems.append(f"clip.delta with loss_variant {variant!r}: it caps the clip's ratio, which only {clippers} "
                        "take; leave it unset")
    if model_args.get("loss_knobs") is not None and row.knobs is None:
        problems.append(f"loss_knobs with loss_variant {variant!r}: it takes no knobs; leave it unset")
    for knob in FLAT_KNOBS:
        value = model_args.get(knob)
        fields = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        default = dataclasses.asdict(VARIANTS[knob].knobs())
        if variant != knob and isinstance(fields, dict) and {**default, **fields} != default:
            problems.append(f"{knob} with loss_variant {variant!r}: only loss_variant {knob!r} reads it; leave it at "
                            "its defaults")
        if variant == knob and value is not None and model_args.get("loss_knobs") is not None:
            problems.append(f"{knob} and loss_knobs: {knob} is loss_knobs' old name; give loss_knobs only")
    correction = model_args.get("sampler_correction")
    mode = correction.get("mode", "token_truncate") if isinstance(correction, dict) else getattr(correction, "mode", None)
    if row.weighs_sampler_ratio and mode in ("sequence_truncate", "sequence_mask"):
        problems.append(f"sampler_correction mode {mode!r} with loss_variant {variant!r}: {variant.upper()} takes the "
                        "sampler's per-token ratios into its sequence weight; use mode 'token_truncate' or "
                        "'token_mask'")
    return problems


def dpo_problems(model_args: dict[str, Any]) -> list[str]:
    """Online DPO learns from pairs: no GAE advantages, no surrogate to mask, weight or regularise."""
    problems = []
    if model_args["advantage_mode"] == "gae":
        problems.append("loss_variant 'dpo' learns from preference pairs; it takes no GAE advantages: use another "
                        "advantage_mode")
    on = [name for name in ("entropy", "off_policy_mask_threshold", "sampler_correction")
          if model_args.get(name) is not None] + (["kl.ratio_correction"] if group(model_args, "kl").ratio_correction
                                                  else [])
    return problems + [f"{name} with loss_variant 'dpo': online DPO's loss on pairs has no policy-gradient surrogate "
                       "to mask, weight or regularise; leave it unset" for name in on]
