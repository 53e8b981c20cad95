"""The table of loss variants: one ``LossVariant`` row per ``model.loss_variant``, its formula and every fact the
other parts derive from it (docs/guide.md#loss-family). ``policy.policy_loss`` looks the row up and applies it;
``policy/objective.py`` takes the defaults from it (ratio level, aggregation, clip epsilons, knobs) and
``policy/knob_rules.py`` its rules (which aggregation, ratio level, advantages, clip cap and sampler correction it
takes); the statistics a row returns are logged as returned (``train/<name>``). ``PolicyVariant`` is built from the
table's keys.

A new variant is its formula (a function of ``SurrogateInputs``) and one row, plus its knob type if it has knobs
(a frozen dataclass, set as ``model.loss_knobs``). A package of its own adds rows without touching this file: an
entry point in the group ``lit_grpo.loss_variants`` whose name is the variant's and whose object is its
``LossVariant`` (CONTRIBUTING.md, "Adding a loss"); the table reads them when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from lit_grpo.losses.advantages import check_choice
from lit_grpo.losses.aggregation import Sequences, masked_mean, per_sequence_mean
from lit_grpo.losses.surrogates import (
    SapoTemperatures,
    VespoShape,
    cispo_surrogate,
    clip_surrogate,
    sapo_gate,
    sapo_surrogate,
    vespo_weights,
)

RatioLevel = Literal["token", "sequence"]
ENTRY_POINT_GROUP = "lit_grpo.loss_variants"
DEFAULT_CLIP_EPS = 0.2  # PPO's, the low epsilon whenever it is unset but the high one is set


@dataclass(frozen=True)
class SurrogateInputs:
    """What a variant's formula and statistics read: ``[N, T]`` tensors but ``adv`` (``[N, 1]`` one per sequence, or
    ``[N, T]``). The statistics get them detached."""

    logp: torch.Tensor  # the sampled tokens' log-probs under the current policy (with the gradient)
    ratio: torch.Tensor  # pi_theta / pi_old at the row's ``level``, a sequence's spread over its tokens
    log_ratio: torch.Tensor  # the per-token log ratio, clamped to +-20
    adv: torch.Tensor
    mask: torch.Tensor  # bool: the tokens the loss counts
    eps_low: float
    eps_high: float
    delta: float | None  # two-sided clipping's cap (model.clip_delta), None: none
    knobs: Any  # the row's knob type, as set (model.loss_knobs) or its defaults; None for a row without knobs
    level: RatioLevel
    sampler_ratio: torch.Tensor | None  # pi_old / pi_sampler, for a row that weighs it itself (else applied after)
    sequences: Sequences | None  # a tool task's episodes, where a sequence spans several rows


@dataclass(frozen=True)
class LossVariant:
    """One loss variant.

    Args:
        surrogate: its per-token loss to minimise, ``[N, T]``, from ``SurrogateInputs``.
        ratio_level: the level of its ratio unless ``model.ratio_level`` says.
        ratio_levels: the levels ``model.ratio_level`` may choose (empty: it takes none).
        aggregation: its aggregation unless ``model.aggregation`` says; ``aggregation_required``: it takes no other.
        per_sequence_advantage: it weighs a whole sequence by one advantage (``[N]`` advantages only, no GAE).
        clips: it clips the ratio, and ``model.clip_delta`` caps it.
        clip_eps: the (low, high) epsilons when neither is set (high None: the low one).
        clip_eps_high: the high epsilon whenever it is unset (CISPO's cap), None: the low one.
        knobs: the dataclass of its knobs (``model.loss_knobs``), None: it takes none.
        statistics: its own figures from the detached inputs, named as logged (``train/<name>``).
        weighs_sampler_ratio: its formula takes the sampler correction's ratio into its own weight (VESPO's sequence
            weight) instead of having it multiplied onto its per-token loss.
    """

    surrogate: Callable[[SurrogateInputs], torch.Tensor]
    ratio_level: RatioLevel = "token"
    ratio_levels: tuple[RatioLevel, ...] = ("token", "sequence")
    aggregation: str = "seq-mean"
    aggregation_required: bool = False
    per_sequence_advantage: bool = False
    clips: bool = False
    clip_eps: tuple[float, float | None] = (DEFAULT_CLIP_EPS, None)
    clip_eps_high: float | None = None
    knobs: type | None = None
    statistics: Callable[[SurrogateInputs], dict[str, torch.Tensor]] | None = None
    weighs_sampler_ratio: bool = False


@runtime_checkable
class ChecksItself(Protocol):
    """A knob type that checks its own values: one message per field out of range, naming the field."""

    def problems(self) -> list[str]: ...


def clip_loss(x: SurrogateInputs) -> torch.Tensor:
    return clip_surrogate(x.ratio, x.adv, x.eps_low, x.eps_high, x.delta)


def clip_statistics(x: SurrogateInputs) -> dict[str, torch.Tensor]:
    """With delta, ``clip_ratio/delta_mean``: the tokens of negative advantage whose ratio the cap holds."""
    if x.delta is None:
        return {}
    capped = (x.adv < 0) & (x.ratio > x.delta)
    return {"clip_ratio/delta_mean": masked_mean(capped.expand_as(x.logp).to(x.logp.dtype), x.mask)}


def cispo_statistics(x: SurrogateInputs) -> dict[str, torch.Tensor]:
    """``cispo_clip_ratio``: tokens (sequences, at sequence level) of positive advantage above the cap."""
    capped = ((x.ratio > 1.0 + x.eps_high) & (x.adv > 0)).to(x.logp.dtype)  # [N, T]
    sequence = x.level == "sequence" and capped.shape[1]
    return {"cispo_clip_ratio": per_sequence_mean(capped[:, 0], x.sequences) if sequence
            else masked_mean(capped, x.mask)}


def vespo_phi(x: SurrogateInputs) -> torch.Tensor:
    """VESPO's sequence weight ``[N, 1]`` (``surrogates.vespo_weights``), the sampler's ratio taken into w."""
    sampler_log = None if x.sampler_ratio is None else torch.log(x.sampler_ratio)
    k = x.knobs
    return vespo_weights(x.log_ratio, x.adv, x.mask, sampler_log, k.k_pos, k.lambda_pos, k.k_neg, k.lambda_neg,
                         x.sequences)


BUILT_IN: dict[str, LossVariant] = {
    "reinforce": LossVariant(lambda x: -x.adv * x.logp, ratio_levels=()),
    "unclipped": LossVariant(lambda x: -x.adv * x.ratio),
    "clip": LossVariant(clip_loss, clips=True, statistics=clip_statistics),
    "gspo": LossVariant(clip_loss, ratio_level="sequence", ratio_levels=("sequence",), aggregation_required=True,
                        per_sequence_advantage=True, clips=True, clip_eps=(3e-4, 4e-4),  # the GSPO paper's epsilons
                        statistics=clip_statistics),
    "cispo": LossVariant(lambda x: cispo_surrogate(x.logp, x.ratio, x.adv, 1.0 + x.eps_high), aggregation="token-mean",
                         clip_eps_high=4.0, statistics=cispo_statistics),  # a cap of 5, ScaleRL's epsilon_max
    "sapo": LossVariant(lambda x: sapo_surrogate(x.ratio, x.adv, x.knobs.pos, x.knobs.neg), knobs=SapoTemperatures,
                        statistics=lambda x: {"sapo/gate_mean": masked_mean(
                            sapo_gate(x.ratio, x.adv, x.knobs.pos, x.knobs.neg), x.mask)}),
    "luspo": LossVariant(clip_loss, ratio_level="sequence", aggregation="seq-sum", aggregation_required=True,
                         per_sequence_advantage=True, clips=True, clip_eps=(3e-4, 4e-4), statistics=clip_statistics),
    "vespo": LossVariant(lambda x: -vespo_phi(x) * x.adv * x.logp, ratio_levels=(), aggregation="token-mean",
                         per_sequence_advantage=True, knobs=VespoShape, weighs_sampler_ratio=True,
                         statistics=lambda x: {"vespo/phi_seq_mean": per_sequence_mean(vespo_phi(x)[:, 0],
                                                                                       x.sequences)}),
}


def with_entry_points(rows: dict[str, LossVariant], found: Iterable[EntryPoint]) -> dict[str, LossVariant]:
    """``rows`` and the rows the entry points give (each loaded: its name the variant's, its object a
    ``LossVariant``). Raises ``ImportError`` naming an entry point that clashes with a row or is no ``LossVariant``."""
    table = dict(rows)
    for point in found:
        where = f"entry point {point.name} = {point.value} (group {ENTRY_POINT_GROUP})"
        if point.name in table or point.name == "dpo":
            raise ImportError(f"{where}: loss variant {point.name!r} exists already; give it another name")
        row = point.load()
        if not isinstance(row, LossVariant):
            raise ImportError(f"{where}: expected a lit_grpo.losses.variants.LossVariant, got {type(row).__name__}")
        table[point.name] = row
    return table


VARIANTS: dict[str, LossVariant] = with_entry_points(BUILT_IN, entry_points(group=ENTRY_POINT_GROUP))
PolicyVariant = Literal[tuple(VARIANTS)]  # type: ignore[valid-type]  # the table's keys, as jsonargparse reads them
POLICY_VARIANTS: tuple[str, ...] = tuple(VARIANTS)


def variant_row(name: str) -> LossVariant:
    """The row of ``name``; ``ValueError`` naming the choices for another."""
    check_choice("loss variant", name, tuple(VARIANTS))
    return VARIANTS[name]


def detached(x: SurrogateInputs) -> SurrogateInputs:
    """The inputs without the gradient, as the statistics take them."""
    return replace(x, logp=x.logp.detach(), ratio=x.ratio.detach(), adv=x.adv.detach())
