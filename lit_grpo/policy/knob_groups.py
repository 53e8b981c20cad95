"""``PolicyModule``'s knobs that belong together, one frozen dataclass a topic (``--model.<group>.<field>`` on the
command line, ``<group>: {<field>: ...}`` in a config), and the one place that reads the module's arguments into
them (``regroup``): a group given as its dataclass or as a (partial) mapping, and the knobs' flat names before the
groups (``run.objective_knobs.FLAT_NAMES``, deprecated for one release) folded in. Every reader of the module's
arguments reads what ``regroup`` gives (the module's ``hparams`` hold it, each group as a plain mapping)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.losses import KLEstimator
from lit_grpo.policy.logprobs import CHUNK_TOKENS
from lit_grpo.run.objective_knobs import FLAT_NAMES, as_spec, plain, read_group
from lit_grpo.run.rules import choice_problems
from lit_grpo.tree import FlatGroups, StdScope, ValueMode


@dataclass(frozen=True)
class LoraAdapter:
    """The trainable LoRA adapter (old names ``lora_rank``, ``lora_alpha``, ...).

    Args:
        rank: LoRA rank r.
        alpha: LoRA alpha (the update is scaled by alpha / r).
        dropout: dropout on the LoRA input during training updates; 0 keeps the update forward identical to the
            sampler's.
        target_modules: module names to adapt, or ``all-linear`` for every linear layer but the output head.
    """

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"

    def problems(self) -> list[str]:
        problems = [] if self.rank >= 1 else [f"lora.rank: must be >= 1, got {self.rank}"]
        if not self.alpha > 0:
            problems.append(f"lora.alpha: must be > 0 (the adapter's scale is alpha / rank), got {self.alpha}")
        if not 0 <= self.dropout < 1:
            problems.append(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        return problems


@dataclass(frozen=True)
class KLPenalty:
    """The KL penalty to the reference policy (old names ``kl_coef``, ``kl_estimator``, ``kl_in``,
    ``kl_ratio_correction``).

    Args:
        coef: beta, the weight of the KL to the reference policy; 0 skips the reference pass.
        estimator: ``k1``, ``k2`` or ``k3`` per-token KL estimate.
        applied_to: ``loss`` adds beta * KL to the loss (GRPO); ``reward`` subtracts beta * sum of k1 from each
            sequence's reward before the advantages (grouped rollouts only).
        ratio_correction: each token's KL term times pi_theta / pi_old (unbiased off-policy; DeepSeek-V3.2's).
    """

    coef: float = 0.04
    estimator: KLEstimator = "k3"
    applied_to: Literal["loss", "reward"] = "loss"
    ratio_correction: bool = False

    def problems(self) -> list[str]:
        return [] if self.coef >= 0 else [f"kl.coef: must be >= 0, got {self.coef}"]


@dataclass(frozen=True)
class ClipRange:
    """The surrogate's clip (old names ``clip_eps``, ``clip_eps_high``, ``clip_delta``); ``None``: the loss variant's
    row's (``lit_grpo.losses.variants``).

    Args:
        eps: lower clip epsilon; ``None``: the row's.
        eps_high: upper clip epsilon (DAPO's clip-higher; cispo's cap 1 + it); ``None``: the row's, else ``eps``.
        delta: two-sided clipping (INTELLECT-2): delta caps the unclipped term's ratio (> 1 + eps_high).
    """

    eps: float | None = None
    eps_high: float | None = None
    delta: float | None = None

    def problems(self) -> list[str]:
        problems = [f"clip.{name}: must be positive, got {value}" for name, value in
                    (("eps", self.eps), ("eps_high", self.eps_high)) if value is not None and not 0 < value < 10]
        if self.delta is not None and not self.delta > 1:
            problems.append(f"clip.delta: must be above 1 (a cap on the ratio; INTELLECT-2 uses 4), got {self.delta}")
        return problems


@dataclass(frozen=True)
class TreeAdvantages:
    """The advantages of ``tree`` rollouts (old names ``tree_value_mode``, ``tree_std_scope``, ``tree_flat_groups``).

    Args:
        value_mode: node values: ``mean`` (Bellman expectation over the sampled children), ``optimal_stopping``
            (answer now or ask, by the sampled future) or ``optimal_stopping_split`` (docs/guide.md).
        std_scope: what divides the sibling-relative advantages: the std of the whole ``tree``'s leaf returns, of
            each ``siblings`` group's Q, or nothing (``none``; docs/benchmarks.md compares them).
        flat_groups: rows in flat sibling groups (advantage exactly 0, only children included): ``count`` keeps them
            in the loss and its normaliser, ``drop`` leaves them out as DAPO leaves flat groups.
    """

    value_mode: ValueMode = "mean"
    std_scope: StdScope = "tree"
    flat_groups: FlatGroups = "count"


@dataclass(frozen=True)
class ValueBaseline:
    """PPO's value head and GAE, read with ``advantage_mode: gae`` only (old names ``vf_coef``, ``vf_clip``,
    ``gamma``, ``gae_lambda``).

    Args:
        coef: weight of the value loss.
        clip: PPO's value clipping range around the old values; ``None`` turns it off.
        gamma: GAE discount.
        gae_lambda: GAE lambda.
    """

    coef: float = 0.5
    clip: float | None = 0.2
    gamma: float = 1.0
    gae_lambda: float = 0.95

    def problems(self) -> list[str]:
        problems = [] if self.clip is None or self.clip > 0 else [f"value.clip: must be positive or None, got "
                                                                    f"{self.clip}"]
        if not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            problems.append(f"value.gamma and value.gae_lambda must be in [0, 1], got {self.gamma} and "
                            f"{self.gae_lambda}")
        return problems


@dataclass(frozen=True)
class MemoryUse:
    """What trades memory for compute in the trainer's forwards (old names: the fields' own).

    Args:
        gradient_checkpointing: keep one activation per layer and recompute the rest in backward (non-reentrant,
            so it works with PEFT's frozen embeddings and the packed forward): activation memory drops from every
            layer's intermediates to one layer's, for about a third more compute.
        logprob_chunk_tokens: tokens per output-head chunk: log-probs are computed from the last hidden states of
            the counted tokens only, this many at a time, each chunk's ``[tokens, vocab]`` logits recomputed in
            backward instead of kept (docs/guide.md#your-own-model). Lower it for a larger vocabulary or less memory.
        no_grad_batch_tokens: padded tokens per forward in the no-grad passes (pi_old, pi_ref, old values).
        packed_forward: compute each shared prefix once (a group's prompt, a tree node's ancestors) by packing rows
            into one with a 4-D ancestor mask (docs/guide.md#your-own-model); same log-probs and gradients as the
            padded forward. Falls back to the padded forward, with an info message, where the attention kernel takes
            no custom mask. PPO's value-head forward (``advantage_mode: gae``) stays padded.
    """

    gradient_checkpointing: bool = False
    logprob_chunk_tokens: int = CHUNK_TOKENS
    no_grad_batch_tokens: int = 16384
    packed_forward: bool = True

    def problems(self) -> list[str]:
        problems = [] if isinstance(self.packed_forward, bool) else [
            f"memory.packed_forward: must be true or false, got {self.packed_forward!r}"]
        return problems + [f"memory.{name}: must be >= 1, got {getattr(self, name)}"
                           for name in ("no_grad_batch_tokens", "logprob_chunk_tokens") if getattr(self, name) < 1]


GROUPS: dict[str, type] = {"lora": LoraAdapter, "kl": KLPenalty, "clip": ClipRange, "tree": TreeAdvantages,
                           "value": ValueBaseline, "memory": MemoryUse}


class Regrouped(NamedTuple):
    """What ``regroup`` read: the arguments with every group as its dataclass and no flat name; the spelling's
    problems (a group's unknown field, a value out of its choices or range, a knob given by both its names); the
    flat names that filled a group (each to warn about once)."""

    arguments: dict[str, Any]
    problems: list[str]
    flat_names: list[str]


def field_default(group: str, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(GROUPS[group]) if f.name == name)


def regroup(args: dict[str, Any]) -> Regrouped:
    """The module's arguments read into their groups. A flat name away from its default (the field's) fills its
    field; given with the field also away from its default, it is refused (give the group's field only). Arguments
    already regrouped come back the same (their plain mappings as dataclasses)."""
    arguments = {name: value for name, value in args.items() if name not in FLAT_NAMES}
    problems, flat_names = [], []
    for name, cls in GROUPS.items():
        spec, unread = read_group(name, cls, args.get(name))
        arguments[name] = spec or cls()
        problems += unread
    for old, new in FLAT_NAMES.items():
        group, name = new.split(".")
        default = field_default(group, name)
        if old not in args or args[old] == default:
            continue
        if getattr(arguments[group], name) != default:
            problems.append(f"{old}: the old name of {new}, which is given too; give {new} only")
            continue
        arguments[group] = dataclasses.replace(arguments[group], **{name: args[old]})
        flat_names.append(old)
    for name, cls in GROUPS.items():
        spec = arguments[name]
        problems += [f"{name}.{problem}" for problem in choice_problems(cls, dataclasses.asdict(spec))]
        problems += spec.problems() if hasattr(spec, "problems") else []
    return Regrouped(arguments, problems, flat_names)


def group(args: Any, name: str) -> Any:
    """One group of regrouped arguments (a module's ``hparams`` hold it as a plain mapping) as its dataclass."""
    value = args.get(name) if hasattr(args, "get") else getattr(args, name, None)
    return as_spec(GROUPS[name], value) or GROUPS[name]()


def plain_arguments(arguments: dict[str, Any]) -> dict[str, Any]:
    """Regrouped arguments with every group (and dataclass) as a plain mapping: what checkpoints hold (they load
    with weights_only=True)."""
    return {name: plain(value) for name, value in arguments.items()}


def warn_flat_names(flat_names: list[str]) -> None:
    """A ``FutureWarning`` for each flat name that filled a group, naming its new spelling."""
    for old in flat_names:
        rank_zero_warn(f"PolicyModule: model.{old} is deprecated and goes in the next release; set "
                       f"model.{FLAT_NAMES[old]} instead", category=FutureWarning)


def flat_names_doc() -> str:
    """``PolicyModule.__init__``'s docstring: its deprecated flat names, each with its new spelling (``--help``)."""
    lines = [f"    {old}: deprecated, goes in the next release: {new}." for old, new in FLAT_NAMES.items()]
    return "\n".join(["The groups' fields by their flat names before the groups.", "", "Args:", *lines, ""])
