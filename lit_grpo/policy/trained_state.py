"""What a checkpoint and the final adapter keep of a ``PolicyModule``: the trained weights (the adapter, the value
and risk heads, the parameters with ``requires_grad``) and the risk head's replay and adaptive entropy coefficient;
the adapter in PEFT format at the end of fit. The frozen base stays in the model files. Functions of what they read
(the module's named parameters, the checkpoint, the states that go with it): the module's hooks call them."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_grpo.errors import InputError
from lit_grpo.policy.policy_step import EntropyCoefficient
from lit_grpo.risk.fit import RiskReplay
from lit_grpo.run.resume import checkpoint_misfit_message, evaluated_model_problem
from lit_grpo.run.run_dir import unused_directory

Parameters = Iterable[tuple[str, torch.nn.Parameter]]  # a module's ``named_parameters()``


def trainable_keys(parameters: Parameters) -> set[str]:
    """State-dict keys of the trained weights: the adapter, and the value and risk heads if any."""
    return {name for name, p in parameters if p.requires_grad}


def trained_weights(parameters: Parameters, destination: MutableMapping[str, Any] | None = None, prefix: str = "",
                    keep_vars: bool = False) -> MutableMapping[str, Any]:
    """The trained weights under ``prefix`` (detached unless ``keep_vars``), added to ``destination`` when a wrapping
    module's ``state_dict`` recurses into the module, else in a new dict. The frozen base is in the model files
    (walking the whole model's state cost a one-step epoch of the quickstart ~5%)."""
    weights = {} if destination is None else destination
    for name, p in parameters:
        if p.requires_grad:
            weights[prefix + name] = p if keep_vars else p.detach()
    return weights


class OnlyTrainedMissing:
    """Load hooks (``nn.Module.register_load_state_dict_pre_hook`` and ``..._post_hook``) that count only the trained
    weights as missing when the module loads, on its own or inside a wrapping module's load (under its prefix): the
    frozen base is in the model files, never in ``state_dict``. Holds the prefix of the load under way."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.prefix = ""
        module.register_load_state_dict_pre_hook(self.note_prefix)
        module.register_load_state_dict_post_hook(self.drop_frozen)

    def note_prefix(self, module: torch.nn.Module, state_dict: Any, prefix: str, *rest: Any) -> None:
        self.prefix = prefix

    def drop_frozen(self, module: torch.nn.Module, keys: Any) -> None:
        trainable, prefix = trainable_keys(module.named_parameters()), self.prefix
        keys.missing_keys[:] = [key for key in keys.missing_keys  # in place, as torch asks of a post hook
                                if not key.startswith(prefix) or key[len(prefix):] in trainable]


def refuse_incomplete(keys: Any, strict: bool, owner: str) -> Any:
    """``load_state_dict``'s ``keys`` (a non-strict load's, the frozen base not counted as missing): a strict load
    with a trained weight missing or an unexpected key fails, naming them."""
    if strict and (keys.missing_keys or keys.unexpected_keys):
        raise RuntimeError(f"{owner}.load_state_dict: missing trained weights {keys.missing_keys}, "
                           f"unexpected keys {keys.unexpected_keys}")
    return keys


def keep_trained_state(checkpoint: dict[str, Any], parameters: Parameters, risk_replay: RiskReplay | None,
                       entropy_coef: EntropyCoefficient | None) -> None:
    """``on_save_checkpoint``: the trained weights only (whatever a strategy gathered), the detached risk head's
    replay, and the entropy coefficient when adaptive (a resumed run goes on from where it was)."""
    trainable = trainable_keys(parameters)
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
    if risk_replay is not None:
        checkpoint["risk_replay"] = risk_replay.state_dict()
    if entropy_coef is not None and entropy_coef.control.adaptive:
        checkpoint["entropy_coef"] = entropy_coef.state_dict()


def restore_trained_state(checkpoint: dict[str, Any], parameters: Parameters, trainer: pl.Trainer | None,
                          model_name: str, risk_replay: RiskReplay | None,
                          entropy_coef: EntropyCoefficient | None) -> None:
    """``on_load_checkpoint`` (under ``trainer``, None without one): refuse a checkpoint of another base model than
    ``model_name`` (for ``validate`` / ``test``: by its hyper-parameters' model name too, as the command does before
    the model loads) or lacking a trained weight; restore the risk replay and the adaptive entropy coefficient it
    holds."""
    trainable = {name: tuple(p.shape) for name, p in parameters if p.requires_grad}
    ckpt_path = None if trainer is None else trainer.ckpt_path
    evaluating = trainer is not None and trainer.state.fn in ("validate", "test")
    saved_model = (checkpoint.get("hyper_parameters") or {}).get("model_name_or_path")
    other_base = (evaluating and evaluated_model_problem(ckpt_path, saved_model, model_name)) or (
        checkpoint_misfit_message(ckpt_path, checkpoint["state_dict"], trainable, saved_model, model_name, evaluating))
    missing = sorted(set(trainable) - set(checkpoint["state_dict"]))
    if other_base or missing:
        raise InputError(other_base or f"checkpoint lacks {len(missing)} trained tensors (e.g. {missing[0]})")
    if risk_replay is not None and "risk_replay" in checkpoint:
        risk_replay.load_state_dict(checkpoint["risk_replay"])
    if entropy_coef is not None and entropy_coef.control.adaptive and "entropy_coef" in checkpoint:
        entropy_coef.load_state_dict(checkpoint["entropy_coef"])


def adapter_directory(trainer: Any) -> Path:
    """Where fit's end saves the adapter: ``<log dir>/adapter`` (every rank asks: a broadcast under DDP)."""
    return Path(trainer.log_dir or trainer.default_root_dir) / "adapter"


@rank_zero_only
def save_adapter(policy: Any, tokenizer: Any, target: Path) -> Path:
    """The trained adapter of ``policy`` in PEFT format, with ``tokenizer``, under ``target``, or beside it under a
    fresh name if ``target`` holds files already (never written over); returns where it went (rank 0 writes)."""
    target = unused_directory(target)
    policy.save_pretrained(str(target), selected_adapters=[policy.active_adapter])
    tokenizer.save_pretrained(str(target))
    rank_zero_info(f"adapter saved to {target}")
    return target
