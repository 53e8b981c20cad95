"""The ``lit-grpo`` command's LightningCLI over PolicyModule and RolloutDataModule: its defaults, its sections, the
configuration check before any class is built, the subcommands' checkpoint arguments settled."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.cli import refusals
from lit_grpo.cli.checkpoint_io import BackgroundCheckpointIO
from lit_grpo.cli.checkpoint_section import CHECKPOINT_DEFAULTS, fixed_dir_last, settle_checkpoint_files
from lit_grpo.cli.command_line import check_config_files, merged_config
from lit_grpo.cli.config_check import config_problems
from lit_grpo.engines.server_pool import ServersUnavailable
from lit_grpo.errors import InputError
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.distributed import share_cores
from lit_grpo.run.exit_codes import Outcome, exit_code
from lit_grpo.run.resume import check_resume, find_last_checkpoint, resume_point
from lit_grpo.run.run_dir import (
    check_writable,
    claim_version,
    default_run_dir,
)

DEBUG_ENV = "LIT_GRPO_DEBUG"  # set to 1 to see the traceback behind a one-line input error

# The command's defaults, so that a config need not spell them. Nothing a run depends on exists only here: the data
# module refuses a trainer without the reload or (under DDP) with the distributed sampler, in its setup, and the
# module's configure_callbacks adds NonFiniteGuard, RngState, StopOnSigterm and SaveOnInterrupt, whoever builds
# the Trainer.
TRAINER_DEFAULTS: dict[str, Any] = {
    "reload_dataloaders_every_n_epochs": 1,  # every epoch trains on fresh rollouts (required: refused otherwise)
    "num_sanity_val_steps": 0,  # the pre-training validation of on_train_start does its job (a sanity check is
    # harmless but repeats part of it)
    "log_every_n_steps": 1,
    "use_distributed_sampler": False,  # under DDP each rank's rollout buffer is already its own share (required)
}


class LitGRPOCLI(LightningCLI):
    """LightningCLI that checks the whole merged config first and reports every problem in one message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_defaults", TRAINER_DEFAULTS)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)  # the optimizer is PolicyModule's own argument
        refusals.install_builder()  # a class refusing its arguments is named where it is built (cli/refusals.py)
        super().__init__(PolicyModule, RolloutDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        # always-on callbacks, configured in their own sections; a user's trainer.callbacks adds to them
        parser.add_lightning_class_args(RolloutMetrics, "metrics")
        # not a Lightning callback section (those are handed to every Trainer): instantiate_trainer adds it unless
        # the user turns checkpointing off
        parser.add_class_arguments(ModelCheckpoint, "checkpoint", fail_untyped=False, sub_configs=True)
        parser.set_defaults(CHECKPOINT_DEFAULTS)

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        section = subcommand_section(self.config_init)
        settings = {**section["trainer"], **kwargs}
        # the always-on checkpoint callback steps aside when the user turns checkpointing off
        callbacks = settings.get("callbacks") or []
        callbacks = [*callbacks] if isinstance(callbacks, list) else [callbacks]
        if settings.get("enable_checkpointing") is not False:
            callbacks.append(section["checkpoint"])
        kwargs["callbacks"] = [*callbacks, ServerOutageAdvice()]
        # fast_dev_run turns the logger off too: without a directory of its own the run would write into the cwd
        no_logger = settings.get("logger") is False or settings.get("fast_dev_run")
        if no_logger and settings.get("default_root_dir") is None:
            kwargs["default_root_dir"] = default_run_dir()  # not the current directory
            print(f"lit-grpo: no logger; this run writes to {kwargs['default_root_dir']}", file=sys.stderr)
        # NonFiniteGuard, RngState, StopOnSigterm and SaveOnInterrupt come from PolicyModule.configure_callbacks,
        # as under any Trainer
        try:  # the Trainer refusing its arguments is named as any class is (no lit-grpo code runs in it)
            trainer = refusals.built_as(self.trainer_class, functools.partial(super().instantiate_trainer, **kwargs))
        except MisconfigurationException as error:  # Lightning's own refusal of a trainer value, before any work
            raise InputError(f"trainer: {error}") from None
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # Lightning's default; a user's plugin is kept
            trainer.strategy.checkpoint_io = BackgroundCheckpointIO()  # written beside, renamed, in the background
        check_writable(trainer)  # before any weights load
        claim_version(trainer)
        report_core_share(share_cores(trainer))  # before Lightning's launcher, which would count one node only
        return trainer

    def before_instantiate_classes(self) -> None:
        note = settle_checkpoint_files(subcommand_section(self.config)["checkpoint"])
        if note:
            print(f"lit-grpo: {note}", file=sys.stderr)

    # LightningCLI calls before_<subcommand> before it takes the subcommand's arguments from config_init (an order
    # tests/test_private_apis.py pins)
    def before_fit(self) -> None:
        self.settle_checkpoint_arguments("fit")

    def before_validate(self) -> None:
        self.settle_checkpoint_arguments("validate")

    def before_test(self) -> None:
        self.settle_checkpoint_arguments("test")

    def before_predict(self) -> None:
        self.settle_checkpoint_arguments("predict")

    def settle_checkpoint_arguments(self, subcommand: str) -> None:
        """The subcommand's ``weights_only`` and ``ckpt_path``, settled before the Trainer method receives them:
        weights-only reads by default, ``last`` named as a file, a given file checked against this run."""
        arguments = self.config_init[subcommand]
        if "weights_only" in arguments and arguments["weights_only"] is None:  # the Trainer method takes it
            arguments["weights_only"] = True  # a checkpoint is never unpickled beyond tensors and plain containers
        if arguments.get("ckpt_path") == "last":
            arguments["ckpt_path"] = find_last_checkpoint(self.trainer) or fixed_dir_last(self.trainer)
        path = arguments.get("ckpt_path")
        if path is not None and path != "last":
            if not Path(path).is_file():
                raise InputError(f"ckpt_path: {path!r} is not a file; pass a .ckpt this program wrote, or 'last'")
            # the task is compared when training goes on from the checkpoint's cursor (validate/test may use another)
            fit = subcommand == "fit" and isinstance(self.datamodule, RolloutDataModule)
            task = self.datamodule.task_identity() if fit else None
            for note in check_resume(path, dict(self.model.hparams), task, type(self.datamodule).__qualname__):
                print(f"lit-grpo: resuming {path}: {note}", file=sys.stderr)

    def instantiate_classes(self) -> None:
        # a class refusing its arguments (a task's low > high, a user reward's own check) is a bad input: its
        # message, before any weights load (the model loads in configure_model, at fit time); anything else raised
        # here is a bug, shown as one (cli/refusals.py, where each class is built)
        try:
            with refusals.building_classes():  # each class the configuration names is built by refusals.build
                super().instantiate_classes()
        except Exception as error:
            refusal = refusals.input_refusal(error)
            if refusal is None:
                error.add_note(refusals.REPORT_BUG)  # printed below its traceback; the command exits with code 1
                raise
            if refusal is error or os.environ.get(DEBUG_ENV):
                raise
            raise refusal from None

    def _parse_ckpt_path(self) -> None:
        """Lightning would parse the checkpoint's hyper-parameters over this run's configuration, after our check and
        above the command line (so a checkpoint could switch ``trust_remote_code`` on). A checkpoint is data: it
        restores weights and loop state; ``check_resume`` compares its hyper-parameters with this run's instead.
        The one private LightningCLI member overridden (no public hook sits between parsing and instantiation):
        ``tests/test_private_apis.py`` fails when an upgrade renames it or stops merging the checkpoint's values."""

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """jsonargparse reads the arguments, every form it and LightningCLI document, exactly as a plain LightningCLI
        does; the configuration check then reports every problem of what it read, at once. Where jsonargparse
        refuses the input it names its first problem only (and exits): the check then reads the files and options
        itself (cli/command_line.py) to list them all, and jsonargparse's own message stands where it finds none."""
        argv = None if isinstance(args, dict) else list(sys.argv[1:] if args is None else args)
        said = io.StringIO()  # what jsonargparse writes, held until it is known whether the check speaks instead
        try:
            with contextlib.redirect_stderr(said):
                super().parse_arguments(parser, args)
        except SystemExit as stop:
            if stop.code == 2 and argv is not None:  # refused: every problem the check finds, before any work
                held, said = said, io.StringIO()  # silent while the check speaks (an unreadable file: its one line)
                merged = merged_config(argv)
                report_problems(config_problems(merged) if merged is not None else [])
                said = held  # the check found nothing: jsonargparse's own words stand
            raise
        finally:  # also ahead of an error of another kind, which shows its own traceback
            sys.stderr.write(said.getvalue())
        if argv is not None:
            check_config_files(argv)  # what jsonargparse reads without a word: a key set twice in one file
        report_problems(config_problems(subcommand_section(self.config).as_dict()))


def subcommand_section(config: Any) -> Any:
    """The subcommand's part of a parsed (or instantiated) configuration; the whole one for a CLI without
    subcommands (``run=False``)."""
    subcommand = config.get("subcommand")
    return config[subcommand] if subcommand else config


def report_problems(problems: list[str]) -> None:
    """Every problem of the configuration in one message, exit code 2; nothing when there is none."""
    if problems:
        listing = "\n".join(f"  - {problem}" for problem in problems)
        print(f"lit-grpo: the configuration has {len(problems)} problem(s):\n{listing}", file=sys.stderr)
        raise SystemExit(exit_code(Outcome.REFUSED_INPUT))


class ServerOutageAdvice(Callback):
    """Tells how to go on when the generation servers stopped answering: only the command knows the checkpoint."""

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, ServersUnavailable):  # the engine names the servers; main prints this advice
            exception.add_note(resume_advice(trainer))


def report_core_share(processes: int) -> None:
    """Each process of a multi-process launch says how many threads it got, so a slow run explains itself."""
    if processes > 1:
        import torch

        print(f"lit-grpo: {processes} processes share this machine's cores: {torch.get_num_threads()} torch "
              f"thread(s) in this one (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})", file=sys.stderr)


def resume_advice(trainer: Any) -> str:
    """How to go on from a run that stopped: from its last checkpoint (this run's, else the one it resumed from)."""
    last = resume_point(trainer)
    if not last:
        return "No epoch had ended, so there is no checkpoint to resume from: run the same command again."
    return f"Resume by running the same command with --ckpt_path {last}"
