"""The ``lit-grpo`` command: LightningCLI over PolicyModule and RolloutDataModule."""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

from lit_grpo.run.exit_codes import Outcome, end_process, exit_code
from lit_grpo.run.idle_threads import idle_threads_sleep

idle_threads_sleep()  # before the imports below load torch (lit_grpo/run/idle_threads.py)


def interrupted_before_training() -> Outcome:
    """Ctrl-C before the trainer runs (the libraries loading, the configuration parsed, the classes built, the resume
    checked): one line; nothing was written, so nothing is saved."""
    print("lit-grpo: interrupted (Ctrl-C) before training began; nothing was written, so nothing to save or resume "
          "from: run the command again", file=sys.stderr, flush=True)
    return Outcome.INTERRUPTED_BEFORE_TRAINING


def terminated_before_training() -> Outcome:
    print("lit-grpo: stopped by SIGTERM before training began; nothing was written to resume from",
          file=sys.stderr, flush=True)
    return Outcome.TERMINATED


# the command itself (its console script, or python -m lit_grpo.cli), not a Python program importing this module
THE_COMMAND = __name__ == "__main__" or Path(sys.argv[0]).name == "lit-grpo"

try:  # the libraries take seconds to load: a Ctrl-C then is one line too, not an import's traceback
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.utilities import rank_zero_only
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from lit_grpo.callbacks import RolloutMetrics
    from lit_grpo.config_check import config_problems
    from lit_grpo.engines.server_pool import Refused, ServersUnavailable
    from lit_grpo.errors import InputError
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run import refusals
    from lit_grpo.run.checkpoint_io import BackgroundCheckpointIO
    from lit_grpo.run.command_line import check_config_files, merged_config
    from lit_grpo.run.distributed import release_process_group, share_cores
    from lit_grpo.run.host_memory import return_freed_memory
    from lit_grpo.run.nonfinite import NonFiniteTrainingError
    from lit_grpo.run.resume import check_resume, find_last_checkpoint, resume_point
    from lit_grpo.run.run_dir import (
        check_writable,
        claim_version,
        default_run_dir,
    )
    from lit_grpo.run.signals import Terminated, command_stop, outcome_of_exit
except KeyboardInterrupt:
    if not THE_COMMAND:  # from Python, an interrupted import stays an interrupted import
        raise
    raise SystemExit(exit_code(interrupted_before_training())) from None

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

# The command's checkpoint callback (section ``checkpoint:``): Lightning's ModelCheckpoint writing one file,
# last.ckpt, at every epoch's end, validated or not (the shipped configs validate every 10 epochs, and a kill before
# the first validation lost the run), replaced in one rename by the checkpoint IO. It is the top-k file rather than
# save_last because Lightning 2.6 writes save_last at an epoch's end only after a top-k save at that step (with
# save_top_k 0, only at the end of fit), and save_top_k 1 with save_last would write every epoch's state twice.
CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "checkpoint.filename": ModelCheckpoint.CHECKPOINT_NAME_LAST,
    "checkpoint.save_top_k": 1,
    "checkpoint.save_on_train_epoch_end": True,
}


class LitGRPOCLI(LightningCLI):
    """LightningCLI that checks the whole merged config first and reports every problem in one message."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("trainer_defaults", TRAINER_DEFAULTS)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("auto_configure_optimizers", False)  # the optimizer is PolicyModule's own argument
        refusals.install_builder()  # a class refusing its arguments is named where it is built (run/refusals.py)
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
        # here is a bug, shown as one (run/refusals.py, where each class is built)
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
        itself (run/command_line.py) to list them all, and jsonargparse's own message stands where it finds none."""
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


def settle_checkpoint_files(checkpoint: Any) -> str | None:
    """The ``checkpoint:`` section's files when the user asks for more than the command's one ``last.ckpt`` (its
    ``filename`` left at ``last``): ``save_top_k: -1`` keeps every epoch's checkpoint under Lightning's own name
    (``epoch=N-step=M.ckpt``) with ``last.ckpt`` a link to the newest (nothing written twice); a top k by a monitored
    metric is named the same, with ``last.ckpt`` written beside whenever one of them is (Lightning's ``save_last``;
    a link would name the best, not the newest). Returns the line that tells the user, None when nothing changed
    (``checkpoint`` is changed in place)."""
    keep = checkpoint.save_top_k
    if checkpoint.filename != ModelCheckpoint.CHECKPOINT_NAME_LAST or keep == 0:
        return None  # the user's own names, or no top-k file at all
    if keep == 1 and checkpoint.monitor is None:
        return None  # the command's one file; Lightning itself refuses k > 1 without a monitor
    checkpoint.filename = None
    if checkpoint.save_last is None:
        checkpoint.save_last = "link" if keep == -1 and checkpoint.monitor is None else True
    kept = "every epoch's checkpoint" if keep == -1 else f"the best {keep} checkpoint(s) by {checkpoint.monitor}"
    last = {"link": "a link to the newest", True: "written beside whenever one of them is"}.get(
        checkpoint.save_last, "not written (checkpoint.save_last: false)")
    return (f"checkpoint: keeping {kept} as epoch=N-step=M.ckpt (Lightning's name; set checkpoint.filename for "
            f"another); last.ckpt is {last}")


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


def fixed_dir_last(trainer: Any) -> str:
    """The newest ``last*.ckpt`` when a fixed checkpoint directory holds a ``last.ckpt`` (the file Lightning would
    pick for ``last``, named so that ``check_resume`` sees it); else an error: ``--ckpt_path last`` with nothing to
    resume must not quietly train from scratch."""
    dirs = [c.dirpath for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.dirpath is not None]
    if not dirs and not trainer.loggers:  # Lightning's own default without a logger
        dirs = [str(Path(trainer.default_root_dir) / "checkpoints")]
    if any((Path(d) / "last.ckpt").is_file() for d in dirs):
        return str(max((p for d in dirs for p in Path(d).glob("last*.ckpt")), key=lambda p: p.stat().st_mtime))
    where = ", ".join(map(str, dirs)) or "the run's log directory (<save_dir>/<name>/version_*/checkpoints)"
    raise InputError(f"ckpt_path: 'last' found no last.ckpt in {where}; start without --ckpt_path, or pass a "
                     "checkpoint file")


def resume_advice(trainer: Any) -> str:
    """How to go on from a run that stopped: from its last checkpoint (this run's, else the one it resumed from)."""
    last = resume_point(trainer)
    if not last:
        return "No epoch had ended, so there is no checkpoint to resume from: run the same command again."
    return f"Resume by running the same command with --ckpt_path {last}"


def refused_global(error: Exception) -> str:
    """The line of torch's weights-only error that names what it refused (``Unsupported global: GLOBAL io.open``)."""
    lines = [line.strip() for line in str(error).splitlines() if "Unsupported" in line]
    return lines[0].split(". Please")[0] if lines else str(error).splitlines()[0]


class DropAdvertisements(logging.Filter):
    """Lightning's tips to install other products are not part of a run's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith("💡 Tip:")


def quiet_third_parties() -> None:
    """The command's log is the run's: no product tips, no weight-loading bar, no deprecation notice that a library
    raises about another's internals (Lightning's own use of torch's pytree)."""
    from transformers.utils import logging as transformers_logging

    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(DropAdvertisements())
    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def main(args: list[str] | None = None) -> None:
    """The command: ``args`` the command line after ``lit-grpo`` (None: ``sys.argv``). It ends with
    ``exit_code(outcome)`` (run/exit_codes.py): 0 finished, 2 a bad input, 1 a failure it explained or Ctrl-C during
    the run, 130 Ctrl-C before training, 143 SIGTERM; a bug raises on (its traceback, code 1). Called without
    arguments it is the process, which after a SIGTERM ends without the interpreter's last garbage collection
    (``end_process``: frozen, the objects alive then are not freed, which some bindings report as leaks at exit, so
    only there); otherwise, and called with arguments (from Python), it raises ``SystemExit`` as usual."""
    with command_stop() as stop:  # SIGTERM stops the command from here (StopOnSigterm takes over during a run)
        try:
            quiet_third_parties()
            return_freed_memory()  # before the model loads: its weights and every step's activations use it
            outcome = run_command(args)
        except SystemExit as stopped:  # Lightning's own after an interrupted run, jsonargparse's, --help
            outcome = outcome_of_exit(stopped, stop.terminated)
            if outcome is None:
                raise
        except Terminated:  # outside the trainer's own handling: before its fit started, or after it ended
            outcome = terminated_before_training()
        finally:  # the outcome is known: a SIGTERM from here on is noted, not raised over the way out
            stop.stopping()
            release_process_group()
    if outcome is Outcome.FINISHED:
        return
    if args is None and outcome is Outcome.TERMINATED:  # the scheduler's grace period: no last collection
        end_process(exit_code(outcome))
    raise SystemExit(exit_code(outcome))


def run_command(args: list[str] | None) -> Outcome:
    """The command's run: how it ended, each kind of failure with its one message."""
    try:
        LitGRPOCLI(args=args)
    except InputError as error:  # a bad input is the user's to fix: its message, not a traceback
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"lit-grpo: {error}", file=sys.stderr)
        return Outcome.REFUSED_INPUT
    except pickle.UnpicklingError as error:  # checkpoints are read with weights_only=True
        print(
            "lit-grpo: refused to load the checkpoint: it holds pickled objects other than tensors and plain "
            f"containers, which could run code when loaded ({refused_global(error)})",
            file=sys.stderr,
        )
        return Outcome.REFUSED_INPUT
    except ServersUnavailable as error:  # the servers are the user's to restart; the run resumes from its checkpoint
        if rank_zero_only.rank == 0:  # every rank stops; rank 0 tells the user, once
            print(" ".join([f"lit-grpo: {error}", *getattr(error, "__notes__", [])]), file=sys.stderr)  # PEP 678
        return Outcome.FAILED
    except Refused as error:  # a 4xx (a wrong key, a server without runtime LoRA): every server would refuse it
        print(f"lit-grpo: {str(error).splitlines()[0]}", file=sys.stderr)
        return Outcome.REFUSED_INPUT
    except MisconfigurationException as error:  # Lightning refusing a setting once it runs (a LearningRateMonitor
        # without a logger; a plateau scheduler's metric never logged): the user's to change, not a bug
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"lit-grpo: {refusals.lightning_refusal(error)}", file=sys.stderr)
        return Outcome.REFUSED_INPUT
    except NonFiniteTrainingError as error:
        print(f"lit-grpo: {error}", file=sys.stderr)
        return Outcome.FAILED
    except Terminated:  # main's to name
        raise
    except KeyboardInterrupt:  # one inside the trainer's run is Lightning's (SaveOnInterrupt; its sys.exit(1))
        return interrupted_before_training()
    return Outcome.FINISHED


if __name__ == "__main__":
    main()
