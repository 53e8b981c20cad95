"""How the ``lit-grpo`` command ends: ``main`` runs it and names its outcome (run/exit_codes.py gives the code), each
kind of failure with its one message; a Ctrl-C while the libraries load is one line too."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import warnings
from pathlib import Path

from lit_grpo.run.exit_codes import Outcome, end_process, exit_code


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


# the command itself (its console script, or python -m lit_grpo.cli, whose package Python loads while sys.argv[0] is
# still "-m"), not a Python program importing this package
THE_COMMAND = Path(sys.argv[0]).name == "lit-grpo" or (sys.argv[0] == "-m" and "lit_grpo.cli" in sys.orig_argv)

try:  # the libraries take seconds to load: a Ctrl-C then is one line too, not an import's traceback
    from lightning.pytorch.utilities import rank_zero_only
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from lit_grpo.cli import refusals
    from lit_grpo.cli.command import DEBUG_ENV, LitGRPOCLI
    from lit_grpo.engines.server_pool import Refused, ServersUnavailable
    from lit_grpo.errors import InputError
    from lit_grpo.run.distributed import release_process_group
    from lit_grpo.run.host_memory import return_freed_memory
    from lit_grpo.run.nonfinite import NonFiniteTrainingError
    from lit_grpo.run.signals import Terminated, command_stop, outcome_of_exit
except KeyboardInterrupt:
    if not THE_COMMAND:  # from Python, an interrupted import stays an interrupted import
        raise
    raise SystemExit(exit_code(interrupted_before_training())) from None


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
