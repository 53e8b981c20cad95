"""What the policy does when a run is interrupted: it keeps its adapter. Declared by ``PolicyModule`` (a callback it
returns from ``configure_callbacks``), so a run started from Python keeps it as the command's does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import lightning.pytorch as pl

from lit_grpo.run import signals
from lit_grpo.run.exit_codes import Outcome, exit_code
from lit_grpo.run.resume import resume_point

if TYPE_CHECKING:
    from lit_grpo.policy.module import PolicyModule

INTERRUPTED_ADAPTER = "adapter-interrupted"


class SaveOnInterrupt(pl.Callback):
    """On Ctrl-C or SIGTERM (``signals.stopped_by_sigterm``: ``StopOnSigterm``'s ``Terminated`` or Lightning's own
    ``SIGTERMException``), save the adapter as it is (``adapter-interrupted`` in the run directory) and print how to
    resume from the last epoch's checkpoint. Nothing here is collective: under DDP a rank that stops waits for no
    other."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None

    def setup(self, trainer: pl.Trainer, pl_module: PolicyModule, stage: str) -> None:
        # read now, while every rank runs the same hook: ``trainer.log_dir`` is a broadcast under DDP
        self.run_dir = Path(trainer.log_dir or trainer.default_root_dir)

    def on_exception(self, trainer: pl.Trainer, pl_module: PolicyModule, exception: BaseException) -> None:
        sigterm = signals.stopped_by_sigterm(exception)
        if not (sigterm or isinstance(exception, KeyboardInterrupt)):
            return
        signals.hold(trainer)  # a SIGTERM arriving now must not cut the save short
        run_dir = self.run_dir or Path(trainer.default_root_dir)
        saved = pl_module.save_adapter(run_dir / INTERRUPTED_ADAPTER) if pl_module.policy is not None else None
        if trainer.global_rank != 0:
            return
        last = resume_point(trainer)
        resume = (f"resume from the last epoch's checkpoint with: lit-grpo fit --config {run_dir / 'config.yaml'} "
                  f"--ckpt_path {last}" if last else "no epoch had ended, so there is no checkpoint to resume")
        what = f"stopped by SIGTERM (exit code {exit_code(Outcome.TERMINATED)})" if sigterm else "interrupted"
        kept = f"the adapter as it was is in {saved}" if saved else "the model had not loaded, so no adapter was saved"
        print(f"lit-grpo: {what}; {kept}; {resume}", file=sys.stderr, flush=True)
