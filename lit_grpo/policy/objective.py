"""Checking PolicyModule's arguments up front, and the loss settings derived from them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.errors import refuse
from lit_grpo.losses.policy import SurrogateOptions
from lit_grpo.losses.variants import DEFAULT_CLIP_EPS, VARIANTS, ChecksItself
from lit_grpo.policy.knob_groups import group, warn_flat_names
from lit_grpo.policy.knob_rules import FLAT_KNOBS, module_knob_problems
from lit_grpo.risk.head import RiskHeadSpec
from lit_grpo.run.objective_knobs import EntropyControl, SamplerCorrection, as_spec, group_problems
from lit_grpo.run.model_files import (
    model_path_problem,
    remote_code_problem,
    resolve_model_path,
)



def module_config_problems(args: dict[str, Any]) -> list[str]:
    """Every problem with PolicyModule's regrouped arguments (``knob_groups.regroup``, which reports the groups' own)
    beyond their choices (``PolicyModule.config_problems`` adds those, read off the signature's ``Literal`` types), as
    messages naming the knob (empty when all is well), the rules among its own knobs included (``knob_rules.py``);
    rules across parts are ``lit_grpo.run.rules``'s."""
    problems = []
    if args["off_policy_mask_threshold"] is not None and not args["off_policy_mask_threshold"] >= 0:
        problems.append(f"off_policy_mask_threshold: must be >= 0 (a KL in nats) or None, got "
                        f"{args['off_policy_mask_threshold']}")
    problems += group_problems(args) + loss_knob_problems(args) + module_knob_problems(args)
    if args["dpo_beta"] <= 0:
        problems.append(f"dpo_beta: must be positive, got {args['dpo_beta']}")
    path_problem = model_path_problem(args["model_name_or_path"])
    if path_problem:
        problems.append(f"model_name_or_path: {path_problem}")
    elif Path(resolve_model_path(args["model_name_or_path"])).is_dir():
        code_problem = remote_code_problem(resolve_model_path(args["model_name_or_path"]), args["trust_remote_code"])
        problems += [f"model_name_or_path: {code_problem}"] if code_problem else []
    problems += risk_spec_problems(args.get("risk"))
    if args.get("head_lr") is not None and args["head_lr"] <= 0:
        problems.append(f"head_lr: must be positive or None, got {args['head_lr']}")
    lora = group(args, "lora")
    problems += adapter_config_problems(args["init_adapter"], lora.rank, lora.target_modules,
                                        None if path_problem else args["model_name_or_path"],
                                        args["trust_remote_code"])
    problems += base_evaluation_problems(args.get("evaluate_base", False), init_adapter=args["init_adapter"])
    return problems


def base_evaluation_problems(evaluate_base: bool, *, init_adapter: str | None = None, ckpt_path: str | None = None,
                             stage: str | None = None) -> list[str]:
    """``evaluate_base`` scores the base model alone (docs/guide.md#evaluating-the-base-model-and-an-adapter): it
    takes no adapter (``init_adapter``), no checkpoint (``ckpt_path``) and trains nothing (``stage`` fit)."""
    if evaluate_base is not True:
        return []
    problems = []
    if init_adapter is not None:
        problems.append(f"evaluate_base: true scores the base model, without an adapter; model.init_adapter "
                        f"{init_adapter!r} gives one: drop one of the two (an adapter is evaluated with "
                        "model.init_adapter alone)")
    if ckpt_path is not None:
        problems.append(f"evaluate_base: true scores the base model, without a checkpoint; ckpt_path {ckpt_path!r} "
                        "gives one: drop one of the two (a checkpoint is evaluated with ckpt_path alone)")
    if stage == "fit":
        problems.append("evaluate_base: true is for lit-grpo validate and test (the base model, nothing trained); "
                        "fit trains an adapter: drop model.evaluate_base")
    return problems


def refuse_base_evaluation(evaluate_base: bool, ckpt_path: str | None, stage: str) -> None:
    """``base_evaluation_problems`` at a module's setup, before any weights load (a Python run's check; the command
    reported a checkpoint already)."""
    refuse("invalid PolicyModule configuration", base_evaluation_problems(evaluate_base, ckpt_path=ckpt_path,
                                                                         stage=stage))


def adapter_config_problems(adapter: str | None, lora_rank: int, targets: Any, model: str | None = None,
                            trust_remote_code: bool = False) -> list[str]:
    """What an ``init_adapter``'s adapter_config.json shows before any weights load: it exists, is JSON, and has
    the configured rank and (when given as a list) target modules; ``all-linear`` is compared once the model is
    loaded (``model_loading.init_adapter_problems``). With the ``model`` it is for, its tensors' shapes (the
    safetensors header) must fit that model's (its config.json): an adapter of another base model is named here."""
    if adapter is None:
        return []
    path = Path(adapter).expanduser() / "adapter_config.json"
    if not path.is_file():
        return [f"init_adapter: {adapter!r} is not a PEFT adapter directory (no adapter_config.json)"]
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return [f"init_adapter: {str(path)!r} is not valid JSON ({error})"]
    problems = []
    if isinstance(config, dict) and config.get("r") not in (None, lora_rank):
        problems.append(f"init_adapter: {adapter!r} has rank {config['r']}, model.lora.rank is {lora_rank}; set "
                        f"model.lora.rank {config['r']}")
    saved = config.get("target_modules") if isinstance(config, dict) else None
    if isinstance(targets, list) and isinstance(saved, list) and sorted(saved) != sorted(targets):
        problems.append(f"init_adapter: {adapter!r} adapts {sorted(saved)}, model.lora.target_modules is "
                        f"{sorted(targets)}; set model.lora.target_modules to the adapter's")
    if model is not None and not problems and (Path(adapter).expanduser() / "adapter_model.safetensors").is_file():
        # torch and transformers are imported only when an adapter is to be compared
        from lit_grpo.policy.model_loading import init_adapter_misfit

        other_base = init_adapter_misfit(adapter, resolve_model_path(model), model, trust_remote_code)
        problems += [other_base] if other_base else []
    return problems


def risk_spec_problems(risk: RiskHeadSpec | dict[str, Any] | None) -> list[str]:
    """Problems of the ``risk`` head spec, given as a ``RiskHeadSpec`` or as the mapping a config file holds."""
    if risk is None:
        return []
    if isinstance(risk, dict):
        try:
            risk = RiskHeadSpec(**risk)
        except TypeError as error:
            return [f"risk: {error}; fields: v_min, v_max, num_atoms, success_threshold, coef, detach, replay_size, "
                    "fit_steps, fit_lr, probe_prompts"]
    return risk.problems()


@dataclass(frozen=True)
class Objective:
    """What the module optimises: the advantage, surrogate, aggregation, KL and correction knobs with their defaults
    filled in (GSPO's clip values for gspo and luspo, CISPO's cap, each variant's own aggregation)."""

    advantage_mode: str
    variant: str
    clip_eps: float
    clip_eps_high: float
    aggregation: str
    kl_coef: float
    kl_estimator: str
    kl_in: str
    surrogate: SurrogateOptions = SurrogateOptions()
    kl_ratio_correction: bool = False
    off_policy_mask_threshold: float | None = None
    entropy: EntropyControl | None = None
    sampler_correction: SamplerCorrection | None = None

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0 or self.variant == "dpo"

    @property
    def needs_entropy(self) -> bool:
        """Whether the training forward computes each token's entropy (entropy control is on)."""
        return self.entropy is not None and (self.entropy.top_quantile < 1.0 or self.entropy.bonus)

    @classmethod
    def from_arguments(cls, args: dict[str, Any]) -> Objective:
        """The objective of PolicyModule's regrouped arguments (``knob_groups.regroup``), each unset loss knob taken
        from the variant's row."""
        variant, clip, kl = args["loss_variant"], group(args, "clip"), group(args, "kl")
        low, high = clip_epsilons(clip.eps, clip.eps_high, variant)
        return cls(
            advantage_mode=args["advantage_mode"],
            variant=variant,
            clip_eps=low,
            clip_eps_high=high,
            aggregation=resolved_aggregation(args),
            kl_coef=kl.coef,
            kl_estimator=kl.estimator,
            kl_in=kl.applied_to,
            surrogate=SurrogateOptions(args.get("ratio_level"), clip.delta, variant_knobs(args)),
            kl_ratio_correction=bool(kl.ratio_correction),
            off_policy_mask_threshold=args.get("off_policy_mask_threshold"),
            entropy=as_spec(EntropyControl, args.get("entropy")),
            sampler_correction=as_spec(SamplerCorrection, args.get("sampler_correction")),
        )


def clip_epsilons(low: float | None, high: float | None, variant: str) -> tuple[float, float]:
    """``(clip_eps, clip_eps_high)`` as set, an unset one from the variant's row: both unset, the row's pair
    (``clip_eps``); the high one unset, the row's ``clip_eps_high`` (CISPO's cap), else the low one; the low one
    unset but the high one set, ``DEFAULT_CLIP_EPS``. dpo's are PPO's (it reads none)."""
    row = VARIANTS.get(variant)
    if row is not None and low is None and high is None:
        low, high = row.clip_eps
    if row is not None and high is None:
        high = row.clip_eps_high
    low = DEFAULT_CLIP_EPS if low is None else low
    return low, low if high is None else high


def resolved_aggregation(args: dict[str, Any]) -> str:
    """``aggregation`` as set, or (None) the variant's row's (dpo's ``seq-mean``)."""
    if args.get("aggregation") is not None:
        return args["aggregation"]
    row = VARIANTS.get(args.get("loss_variant"))
    return "seq-mean" if row is None else row.aggregation


def given_knobs(args: dict[str, Any]) -> tuple[str, Any]:
    """``(argument, value)`` of the variant's knobs as given: ``loss_knobs``, else the deprecated flat argument of
    the variant's name (``sapo``, ``vespo``); ``("loss_knobs", None)`` when neither is."""
    variant = args.get("loss_variant")
    if args.get("loss_knobs") is None and variant in FLAT_KNOBS and args.get(variant) is not None:
        return variant, args[variant]
    return "loss_knobs", args.get("loss_knobs")


def variant_knobs(args: dict[str, Any]) -> Any:
    """The variant's knobs as its row's knob type (its defaults when unset); None for a variant without knobs."""
    row = VARIANTS.get(args["loss_variant"])
    if row is None or row.knobs is None:
        return None
    return as_spec(row.knobs, given_knobs(args)[1]) or row.knobs()


def loss_knob_problems(args: dict[str, Any]) -> list[str]:
    """The variant's knobs as given: fields of its row's knob type, each in its range (the type's ``problems()``)."""
    name, value = given_knobs(args)
    row = VARIANTS.get(args.get("loss_variant"))
    if value is None or row is None or row.knobs is None:
        return []  # a variant without knobs given some: knob_rules.py
    try:
        knobs = as_spec(row.knobs, value)
    except TypeError as error:
        fields = ", ".join(f.name for f in dataclasses.fields(row.knobs))
        return [f"{name}: {error}; fields of {row.knobs.__name__}: {fields}"]
    return [f"{name}.{problem}" for problem in knobs.problems()] if isinstance(knobs, ChecksItself) else []


def warn_deprecated_knobs(args: dict[str, Any], flat_names: list[str] = ()) -> None:
    """A ``FutureWarning`` for each group's flat name that filled it (``flat_names``, ``knob_groups.regroup``'s) and
    when the variant's knobs are given by their old flat name (``sapo``, ``vespo``)."""
    warn_flat_names(flat_names)
    name = given_knobs(args)[0]
    if name != "loss_knobs":
        rank_zero_warn(f"PolicyModule: model.{name} is deprecated and goes in the next release; set model.loss_knobs "
                       "(the same fields) instead", category=FutureWarning)
