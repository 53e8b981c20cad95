"""The grouped knobs of the objectives beyond the clip (each a ``PolicyModule`` argument set as one mapping in a
config, ``--model.<group>.<field>`` on the command line): entropy control and the sampler correction (a loss
variant's own knobs are its row's knob type, ``lit_grpo.losses.variants``). TRL 1.16's ``GRPOConfig`` names are given beside each field (docs/guide.md#from-trl).
The other groups (``lora``, ``kl``, ``clip``, ``tree``, ``value``, ``memory``) are ``lit_grpo.policy.knob_groups``';
their knobs' flat names before them (``FLAT_NAMES``) are spelled here, where a checkpoint's check reads them too."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

# run/ sits below the losses: the modes are spelled here, and losses.importance reads them from here
SamplerCorrectionMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
SAMPLER_CORRECTION_MODES: tuple[str, ...] = get_args(SamplerCorrectionMode)


@dataclass(frozen=True)
class EntropyControl:
    """Entropy control: the policy loss on the highest-entropy tokens only, and an entropy bonus (loss - coef * mean
    token entropy over the tokens the loss counts), whose coefficient can adapt to hold the entropy at a target.
    The training forward then computes each counted token's entropy beside its log-prob, in the same output-head
    chunks (at Qwen2.5-0.5B width, 8 x 512 tokens: 0.15 GB more peak memory and 13% more step time,
    docs/benchmarks.md).

    Args:
        top_quantile: the share of each minibatch's counted tokens, highest entropy first, that the policy loss
            keeps (TRL's ``top_entropy_quantile``; 1.0 keeps all, 0.2 is the paper's).
        coef: the entropy bonus's coefficient (``entropy_coef``; 0 is none), the adaptive one's start.
        adaptive: adapt ``coef`` after every optimizer step (``use_adaptive_entropy``): up by ``coef_delta`` when the
            step's mean entropy is at or below ``target``, else down; applied only while the last step's entropy was
            at or below ``target`` (none before the first step).
        target: the entropy held (``entropy_target``).
        coef_min: the adaptive coefficient's floor (``entropy_coef_min``).
        coef_max: its ceiling (``entropy_coef_max``).
        coef_delta: its step (``entropy_coef_delta``).
    """

    top_quantile: float = 1.0
    coef: float = 0.0
    adaptive: bool = False
    target: float = 0.2
    coef_min: float = 0.0
    coef_max: float = 1.0
    coef_delta: float = 0.005

    @property
    def bonus(self) -> bool:
        return self.coef != 0.0 or self.adaptive

    def problems(self) -> list[str]:
        problems = []
        if not 0 < self.top_quantile <= 1:
            problems.append(f"entropy.top_quantile: must be in (0, 1], got {self.top_quantile}")
        if not math.isfinite(self.coef) or self.coef < 0:
            problems.append(f"entropy.coef: must be >= 0, got {self.coef}")
        if self.adaptive and not 0 <= self.coef_min <= self.coef_max:
            problems.append(f"entropy.coef_min and coef_max: need 0 <= coef_min <= coef_max, got {self.coef_min} and "
                            f"{self.coef_max}")
        if self.adaptive and not self.coef_delta > 0:
            problems.append(f"entropy.coef_delta: must be positive, got {self.coef_delta}")
        if self.adaptive and not self.target >= 0:
            problems.append(f"entropy.target: must be >= 0, got {self.target}")
        if not problems and self.top_quantile == 1.0 and not self.bonus:
            problems.append("entropy: sets nothing (top_quantile 1, coef 0, not adaptive): give top_quantile < 1, "
                            "coef > 0 or adaptive true, or leave entropy unset")
        return problems


@dataclass(frozen=True)
class SamplerCorrection:
    """Correcting for a sampler whose token probabilities differ from the trainer's pi_old (half precision, or an
    older policy when drawing ahead): pi_old is recomputed by the trainer and each token's surrogate is weighted by
    the ratio pi_old / pi_sampler (``losses.importance.sampler_importance_ratio``). TRL's
    ``vllm_importance_sampling_correction`` (on by default there; off by default here, where fp32 engines agree with
    the trainer).

    Args:
        mode: ``token_truncate`` (each token's ratio clamped: TIS), ``token_mask`` (0 outside the bounds: MIS),
            ``sequence_truncate`` or ``sequence_mask`` (the same on the product over the sequence) (TRL's
            ``vllm_importance_sampling_mode``, whose default is ``sequence_mask``).
        clip_min: the lower bound, or None (``vllm_importance_sampling_clip_min``).
        clip_max: the upper bound, or None (``vllm_importance_sampling_clip_max``).
    """

    mode: SamplerCorrectionMode = "token_truncate"
    clip_min: float | None = None
    clip_max: float | None = 3.0

    def problems(self) -> list[str]:
        problems = []
        if self.mode not in SAMPLER_CORRECTION_MODES:
            problems.append(f"sampler_correction.mode: unknown value {self.mode!r}; valid choices: "
                            f"{', '.join(SAMPLER_CORRECTION_MODES)}")
        for name in ("clip_min", "clip_max"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                problems.append(f"sampler_correction.{name}: must be >= 0 or None, got {value}")
        if self.clip_min is not None and self.clip_max is not None and self.clip_min > self.clip_max:
            problems.append(f"sampler_correction: clip_min {self.clip_min} is above clip_max {self.clip_max}")
        if self.clip_min is None and self.clip_max is None:
            problems.append("sampler_correction: give clip_max or clip_min (with neither, nothing is truncated or "
                            "masked)")
        return problems


# PolicyModule's knobs by their flat names before the groups (deprecated for one release): old name -> group.field
FLAT_NAMES: dict[str, str] = {
    "lora_rank": "lora.rank", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
    "lora_target_modules": "lora.target_modules",
    "kl_coef": "kl.coef", "kl_estimator": "kl.estimator", "kl_in": "kl.applied_to",
    "kl_ratio_correction": "kl.ratio_correction",
    "clip_eps": "clip.eps", "clip_eps_high": "clip.eps_high", "clip_delta": "clip.delta",
    "tree_value_mode": "tree.value_mode", "tree_std_scope": "tree.std_scope", "tree_flat_groups": "tree.flat_groups",
    "vf_coef": "value.coef", "vf_clip": "value.clip", "gamma": "value.gamma", "gae_lambda": "value.gae_lambda",
    "gradient_checkpointing": "memory.gradient_checkpointing", "logprob_chunk_tokens": "memory.logprob_chunk_tokens",
    "no_grad_batch_tokens": "memory.no_grad_batch_tokens", "packed_forward": "memory.packed_forward",
}
FLAT_GROUPS = tuple(dict.fromkeys(new.split(".")[0] for new in FLAT_NAMES.values()))  # lora, kl, clip, ...


def dotted(arguments: dict[str, Any]) -> dict[str, Any]:
    """Module arguments (a checkpoint's hyper-parameters, old or new) keyed one knob each: a group's fields as
    ``group.field`` (a group given as a mapping, as checkpoints hold it), an old flat name under its new one."""
    knobs: dict[str, Any] = {}
    for name, value in arguments.items():
        if name in FLAT_GROUPS and isinstance(value, dict):
            knobs.update({f"{name}.{field}": inner for field, inner in value.items()})
        else:
            knobs[FLAT_NAMES.get(name, name)] = value
    return knobs


Spec = TypeVar("Spec")
GROUPS: dict[str, type] = {"entropy": EntropyControl, "sampler_correction": SamplerCorrection}


def as_spec(cls: type[Spec], value: Any) -> Spec | None:
    """A group's value as its dataclass: given as one (the command line), as the mapping a config file or a
    checkpoint's hyper-parameters hold, or None. Raises ``TypeError`` naming an unknown field."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, dict):
        return cls(**value)
    raise TypeError(f"expected a {cls.__name__} or a mapping of its fields, got {type(value).__name__}")


def read_group(name: str, cls: type[Spec], value: Any) -> tuple[Spec | None, list[str]]:
    """A group's value as its dataclass (``as_spec``; None when not given), or None and the problem of reading it
    (an unknown field, the group's fields named)."""
    try:
        return as_spec(cls, value), []
    except TypeError as error:
        fields = ", ".join(f.name for f in dataclasses.fields(cls))
        return None, [f"{name}: {error}; fields: {fields}"]


def group_problems(args: dict[str, Any]) -> list[str]:
    """Each group's problems, its fields named (an unknown field, a value out of range)."""
    problems = []
    for name, cls in GROUPS.items():
        spec, unread = read_group(name, cls, args.get(name))
        problems += unread + ([] if spec is None else spec.problems())
    return problems


def plain(value: Any) -> Any:
    """A group as a plain mapping (hyper-parameters go into checkpoints, which load with weights_only=True)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
