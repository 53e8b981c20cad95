"""The ``lit-grpo`` command (``lit_grpo.cli:main``; ``python -m lit_grpo.cli``), in one folder:

- ``command.py``: ``LitGRPOCLI``, the LightningCLI over PolicyModule and RolloutDataModule, and its defaults;
- ``outcome.py``: ``main``, how the command ends (run/exit_codes.py gives the code) and each failure's one message;
- ``checkpoint_section.py``: the ``checkpoint:`` section and its files, ``--ckpt_path last``;
- ``config_check.py``: every problem of the merged configuration at once, before anything is built, with the
  command line read again where jsonargparse refuses it (``command_line.py``), the names it suggests
  (``config_names.py``) and the strategy check (``strategy.py``);
- ``refusals.py``: a class refusing its arguments, named where it is built; ``checkpoint_io.py``: the checkpoint
  written beside its target and renamed, in the background; ``idle_threads.py``: torch's idle threads sleep.

What every run needs whoever builds the Trainer is in the parts (``PolicyModule.configure_callbacks``, ``run/``).
"""

from __future__ import annotations

from lit_grpo.cli.idle_threads import idle_threads_sleep

idle_threads_sleep()  # before the imports below load torch (cli/idle_threads.py)

# outcome.py first: it loads the libraries (and command.py) under its Ctrl-C guard
from lit_grpo.cli.outcome import main, run_command  # noqa: E402
from lit_grpo.cli.checkpoint_section import CHECKPOINT_DEFAULTS, settle_checkpoint_files  # noqa: E402
from lit_grpo.cli.command import DEBUG_ENV, TRAINER_DEFAULTS, LitGRPOCLI, subcommand_section  # noqa: E402

__all__ = ["CHECKPOINT_DEFAULTS", "DEBUG_ENV", "TRAINER_DEFAULTS", "LitGRPOCLI", "main", "run_command",
           "settle_checkpoint_files", "subcommand_section"]
