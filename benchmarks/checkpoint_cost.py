"""What the per-epoch checkpoint costs a run (issue 34): the quickstart cut to one optimizer step per epoch
(8 prompts x 8 completions = one minibatch of 64), 60 epochs, validation off, with the command's default
checkpointing (A) and with ``--trainer.enable_checkpointing false`` (B). Each run is a whole ``lit-grpo fit`` process
in its own temporary directory, the two alternate (A B A B A B after one uncounted warm-up run), and the script
prints each wall time, each round's ratio A / B and their median.

Each run also records when each epoch starts (a callback added to the trainer); the median epoch, from one epoch's
start to the next's (the checkpoint written in between), is printed too: on a shared machine a burst of other work
stretches a few epochs of one run and moves its wall time by more than the checkpoint costs, and the median of 59
epochs is not moved by it. The 1-minute load average is printed before, after and with each round.

``--with-sync`` adds a third run to each round, S: checkpointing as before issue 34 (``--checkpoint.save_last true``,
two files per epoch, each written and fsynced on the training thread; packed, as every local checkpoint now is).
``--with-unpacked`` adds U: A with the tensors pickled one by one (the background writer before
``checkpoint_file.pack``: each storage copied, the checkpoint pickled as ``torch.save`` does). ``--with-guard-what-if``
adds G: A with NonFiniteGuard checking only the trainable tensors before a save (the ones the checkpoint keeps)
instead of the whole model's state dict.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/checkpoint_cost.py [--pairs 3] [--epochs 60] [--with-sync]
        [--with-unpacked] [--with-guard-what-if]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCK_ENV = "CHECKPOINT_COST_CLOCK"
EPOCH_CLOCK = f"""
import json, os, time
import lightning.pytorch as pl
import lit_grpo.cli

class EpochClock(pl.Callback):
    starts = []
    def on_train_epoch_start(self, trainer, pl_module):
        self.starts.append(time.perf_counter())
    def on_train_end(self, trainer, pl_module):
        self.starts.append(time.perf_counter())
        with open(os.environ["{CLOCK_ENV}"], "w") as clock:
            json.dump(self.starts, clock)

_instantiate = lit_grpo.cli.LitGRPOCLI._instantiate_trainer
lit_grpo.cli.LitGRPOCLI._instantiate_trainer = lambda self, config, callbacks: _instantiate(
    self, config, [*callbacks, EpochClock()])
"""
SYNC = """
from lit_grpo.run.checkpoint_io import BesideTargetCheckpointIO
lit_grpo.cli.BackgroundCheckpointIO = BesideTargetCheckpointIO  # written on the training thread
"""
UNPACKED = """
from lit_grpo.run import checkpoint_io
from lit_grpo.run.checkpoint_file import snapshot
checkpoint_io.pack = snapshot  # a copy of the checkpoint as it is, tensor by tensor
"""
GUARD_TRAINABLE_ONLY = """
from lit_grpo.callbacks import nonfinite
def on_save_checkpoint(self, trainer, pl_module, checkpoint):
    trainable = {name for name, p in pl_module.named_parameters() if p.requires_grad}
    nonfinite.refuse_nonfinite([(k, v) for k, v in checkpoint["state_dict"].items() if k in trainable], "checkpoint")
nonfinite.NonFiniteGuard.on_save_checkpoint = on_save_checkpoint
"""


def command(epochs: int, arm: str) -> list[str]:
    """``arm``: "A" default checkpointing, "B" none, "S" synchronous with two files per epoch, "U" A unpacked, "G" A
    with the guard checking the trainable tensors only."""
    patch = EPOCH_CLOCK + {"S": SYNC, "U": UNPACKED, "G": GUARD_TRAINABLE_ONLY}.get(arm, "")
    return [sys.executable, "-c", patch + "lit_grpo.cli.main()", "fit",
            "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_epochs", str(epochs),
            "--data.prompts_per_epoch", "8", "--data.minibatch_size", "64", "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false",
            *{"B": ["--trainer.enable_checkpointing", "false"], "S": ["--checkpoint.save_last", "true"]}.get(arm, [])]


def timed_run(epochs: int, arm: str) -> tuple[float, float]:
    """Wall seconds of one whole ``lit-grpo fit`` process in a fresh directory and its median epoch in seconds;
    checks what it left there."""
    with tempfile.TemporaryDirectory(prefix="checkpoint-cost-") as run_dir:
        clock = Path(run_dir) / "clock.json"
        started = time.perf_counter()
        done = subprocess.run(command(epochs, arm), check=False, cwd=run_dir,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, CLOCK_ENV: str(clock)})
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"lit-grpo fit failed ({done.returncode}):\n{done.stdout[-3000:]}")
        written = sorted(p.name for p in Path(run_dir).rglob("*.ckpt"))
        expected = [] if arm == "B" else [f"epoch={epochs - 1}-step={epochs}.ckpt", "last.ckpt"]
        if written != expected:
            sys.exit(f"expected checkpoints {expected}, found {written}")
        starts = json.loads(clock.read_text())
    return elapsed, statistics.median(b - a for a, b in itertools.pairwise(starts))


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--with-sync", action="store_true", help="add S, the synchronous two-file checkpointing")
    parser.add_argument("--with-unpacked", action="store_true", help="add U: A with the tensors pickled one by one")
    parser.add_argument("--with-guard-what-if", action="store_true", help="add G: A with the guard checking the "
                        "trainable tensors only")
    args = parser.parse_args()
    arms = ["A", "B", *(["S"] if args.with_sync else []), *(["U"] if args.with_unpacked else []), *(["G"] if args.with_guard_what_if else [])]
    print(f"load average (1 min) {load()}; A = default checkpointing, B = --trainer.enable_checkpointing false"
          + (", S = synchronous, two files" if args.with_sync else "")
          + (", U = A with the tensors pickled one by one" if args.with_unpacked else "")
          + (", G = A with the guard checking trainable tensors only" if args.with_guard_what_if else "")
          + f"; {args.epochs} one-step epochs, validation off", flush=True)
    timed_run(1, "A")  # warm-up: file caches, imports; not counted
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    epochs: dict[str, list[float]] = {arm: [] for arm in arms}
    for pair in range(1, args.pairs + 1):
        for arm in arms:
            wall, epoch = timed_run(args.epochs, arm)
            walls[arm].append(wall)
            epochs[arm].append(epoch)
        print(f"round {pair}: " + ", ".join(f"{arm} {walls[arm][-1]:.2f} s (median epoch {1000 * epochs[arm][-1]:.1f} "
                                            "ms)" for arm in arms)
              + "; " + ", ".join(f"{arm}/B {walls[arm][-1] / walls['B'][-1]:.3f}" for arm in arms if arm != "B")
              + f" (load {load()})", flush=True)
    for arm in (arm for arm in arms if arm != "B"):
        ratios = [a / b for a, b in zip(walls[arm], walls["B"])]
        epoch, base = statistics.median(epochs[arm]), statistics.median(epochs["B"])
        print(f"{arm}/B: median wall ratio {statistics.median(ratios):.3f}; median epoch {1000 * epoch:.1f} ms vs "
              f"{1000 * base:.1f} ms ({epoch / base:.3f}x, {1000 * (epoch - base):+.1f} ms per epoch)")
    print(f"load average (1 min) {load()}")


if __name__ == "__main__":
    main()
