"""What a checkpoint and the final adapter keep of a ``PolicyModule``: the trained weights (the adapter, the value
and risk heads) and the risk head's replay; the adapter in PEFT format at the end of fit. The frozen base stays in
the model files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only

from lit_grpo.errors import InputError
from lit_grpo.run.resume import checkpoint_misfit_message
from lit_grpo.run.run_dir import unused_directory


class TrainedState(pl.LightningModule):
    """The checkpoint and final-adapter hooks of ``PolicyModule``, which sets ``policy``, ``tokenizer``,
    ``risk_replay`` and ``entropy_coef``."""

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Called bare (as Lightning does for a checkpoint): the trained weights only, the frozen base is in the model
        files (walking the whole model's state cost a one-step epoch of the quickstart ~5%). Called with arguments
        (a wrapping module's recursion): ``nn.Module``'s, whole."""
        if args or kwargs:
            return super().state_dict(*args, **kwargs)
        return {name: p.detach() for name, p in self.named_parameters() if p.requires_grad}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """What ``state_dict`` gives back: the frozen base is in the model files, so only a trained weight is reported
        missing (``load_from_checkpoint`` would otherwise warn about every base weight)."""
        keys = super().load_state_dict(state_dict, strict=False, assign=assign)
        trainable = self.trainable_keys()
        keys = keys._replace(missing_keys=[key for key in keys.missing_keys if key in trainable])  # namedtuple's
        if strict and (keys.missing_keys or keys.unexpected_keys):
            raise RuntimeError(f"{type(self).__name__}.load_state_dict: missing trained weights {keys.missing_keys}, "
                               f"unexpected keys {keys.unexpected_keys}")
        return keys

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = self.trainable_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}
        if self.risk_replay is not None:
            checkpoint["risk_replay"] = self.risk_replay.state_dict()
        if self.entropy_coef is not None and self.entropy_coef.control.adaptive:  # it goes on from where it was
            checkpoint["entropy_coef"] = self.entropy_coef.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        trainable = {name: tuple(p.shape) for name, p in self.named_parameters() if p.requires_grad}
        other_base = checkpoint_misfit_message(  # check_resume could not tell before the model loaded
            getattr(self._trainer, "ckpt_path", None), checkpoint["state_dict"], trainable,
            (checkpoint.get("hyper_parameters") or {}).get("model_name_or_path"), self.hparams.model_name_or_path)
        missing = sorted(set(trainable) - set(checkpoint["state_dict"]))
        if other_base or missing:
            raise InputError(other_base or f"checkpoint lacks {len(missing)} trained tensors (e.g. {missing[0]})")
        if self.risk_replay is not None and "risk_replay" in checkpoint:
            self.risk_replay.load_state_dict(checkpoint["risk_replay"])
        if self.entropy_coef is not None and self.entropy_coef.control.adaptive and "entropy_coef" in checkpoint:
            self.entropy_coef.load_state_dict(checkpoint["entropy_coef"])

    def trainable_keys(self) -> set[str]:
        """State-dict keys of the trained weights: the adapter, and the value and risk heads if any."""
        return {name for name, p in self.named_parameters() if p.requires_grad}

    def on_fit_end(self) -> None:
        # every rank asks for the log dir (a broadcast under DDP); rank 0 writes
        self.save_adapter(Path(self.trainer.log_dir or self.trainer.default_root_dir) / "adapter")

    @rank_zero_only
    def save_adapter(self, target: Path) -> Path:
        """The trained adapter in PEFT format under ``target`` (``<log dir>/adapter``), or beside it under a fresh
        name if ``target`` holds files already (never written over); returns where it went."""
        target = unused_directory(target)
        self.policy.save_pretrained(str(target), selected_adapters=[self.policy.active_adapter])
        self.tokenizer.save_pretrained(str(target))
        rank_zero_info(f"adapter saved to {target}")
        return target
