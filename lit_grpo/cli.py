"""The ``lit-grpo`` command: LightningCLI over PolicyModule and RolloutDataModule."""

from __future__ import annotations

import sys
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from lit_grpo.callbacks import RolloutMetrics

from lit_grpo.config_check import config_problems, merged_config
from lit_grpo.datamodule import RolloutDataModule
from lit_grpo.module import PolicyModule

TRAINER_DEFAULTS: dict[str, Any] = {
    "reload_dataloaders_every_n_epochs": 1,  # every epoch trains on fresh rollouts
    "num_sanity_val_steps": 0,  # the pre-training validation runs from on_train_start, where its logs are kept
    "log_every_n_steps": 1,
    "use_distributed_sampler": False,  # under DDP each rank's rollout buffer is already its own share
}


class LitGRPOCLI(LightningCLI):
    """LightningCLI that checks the whole merged config first and reports every problem in one message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_defaults", TRAINER_DEFAULTS)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)  # the optimizer is PolicyModule's own argument
        super().__init__(PolicyModule, RolloutDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        # always-on callbacks, configured in their own sections; a user's trainer.callbacks adds to them
        parser.add_lightning_class_args(RolloutMetrics, "metrics")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True})

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Any:
        # the always-on checkpoint callback steps aside when the user turns checkpointing off
        if config.get("enable_checkpointing") is False:
            callbacks = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
        return super()._instantiate_trainer(config, callbacks)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        argv = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else []
        config = merged_config(argv)
        if config is not None:
            problems = config_problems(config)
            if problems:
                listing = "\n".join(f"  - {problem}" for problem in problems)
                print(f"lit-grpo: the configuration has {len(problems)} problem(s):\n{listing}", file=sys.stderr)
                raise SystemExit(2)
        super().parse_arguments(parser, args)


def main(args: list[str] | None = None) -> None:
    LitGRPOCLI(args=args)


if __name__ == "__main__":
    main()
