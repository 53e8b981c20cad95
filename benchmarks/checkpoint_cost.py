"""What the per-epoch checkpoint costs a run (issue 34): the quickstart cut to one optimizer step per epoch
(8 prompts x 8 completions = one minibatch of 64), 60 epochs, validation off, with the command's default
checkpointing (A) and with ``--trainer.enable_checkpointing false`` (B). Each run is a whole ``lit-grpo fit`` process
in its own temporary directory, the two alternate (A B A B A B after one uncounted warm-up run), and the script
prints each wall time, each round's ratio A / B and their median.

Each run also records when each epoch starts (a callback added to the trainer); the median epoch, from one epoch's
start to the next's (the checkpoint written in between), is printed too: on a shared machine a burst of other work
stretches a few epochs of one run and moves its wall time by more than the checkpoint costs, and the median of 59
epochs is not moved by it. The 1-minute load average is printed before, after and with each round. The order of the
arms is reversed every other round, so that a drift of the machine's speed over the sitting favours none.

``--with-sync`` adds a third run to each round, S: checkpointing as before issue 34 (``--checkpoint.save_last true``,
two files per epoch, each written and fsynced on the training thread; packed, as every local checkpoint now is).
``--with-unpacked`` adds U: A with the tensors pickled one by one (the background writer before
``checkpoint_file.pack``: each storage copied, the checkpoint pickled as ``torch.save`` does). ``--with-guard-what-if``
adds G: A with NonFiniteGuard checking only the trainable tensors before a save (the ones the checkpoint keeps)
instead of the whole model's state dict. ``--within-run`` adds W: twice the epochs with a save after every other
one; the median epoch that ends with a save minus the median that does not, within each run, is what a save costs,
free of the drift between runs that moves each wall time by more than the checkpoint costs (±10% here).

    flock /tmp/heavy.lock .venv/bin/python benchmarks/checkpoint_cost.py [--pairs 3] [--epochs 60] [--with-sync]
        [--with-unpacked] [--with-guard-what-if] [--within-run]
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
import torch
from lit_grpo.run import checkpoint_io
from lit_grpo.run.checkpoint_file import plain_copy, rebuild, tensor_snapshot
def snapshot(self, checkpoint):  # each storage copied; the copy is pickled tensor by tensor, as torch.save does
    storages = {}
    return rebuild(checkpoint, lambda x: tensor_snapshot(x, storages) if isinstance(x, torch.Tensor) else plain_copy(x))
checkpoint_io.BesideTargetCheckpointIO.pack = snapshot
"""
GUARD_TRAINABLE_ONLY = """
from lit_grpo.run import nonfinite
def on_save_checkpoint(self, trainer, pl_module, checkpoint):
    trainable = {name for name, p in pl_module.named_parameters() if p.requires_grad}
    nonfinite.refuse_nonfinite([(k, v) for k, v in checkpoint["state_dict"].items() if k in trainable], "checkpoint")
nonfinite.NonFiniteGuard.on_save_checkpoint = on_save_checkpoint
"""


def command(epochs: int, arm: str) -> list[str]:
    """``arm``: "A" default checkpointing, "B" none, "S" synchronous with two files per epoch, "U" A unpacked, "G" A
    with the guard checking the trainable tensors only, "W" A saving after every other epoch."""
    patch = EPOCH_CLOCK + {"S": SYNC, "U": UNPACKED, "G": GUARD_TRAINABLE_ONLY}.get(arm, "")
    return [sys.executable, "-c", patch + "lit_grpo.cli.main()", "fit",
            "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_epochs", str(epochs),
            "--data.prompts_per_epoch", "8", "--data.minibatch_size", "64", "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false",
            *{"B": ["--trainer.enable_checkpointing", "false"], "S": ["--checkpoint.save_last", "true"],
              "W": ["--checkpoint.every_n_epochs", "2"]}.get(arm, [])]


def timed_run(epochs: int, arm: str) -> tuple[float, list[float]]:
    """Wall seconds of one whole ``lit-grpo fit`` process in a fresh directory and its epochs' seconds (from one
    epoch's start to the next's, the checkpoint written in between); checks what it left there."""
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
    return elapsed, [b - a for a, b in itertools.pairwise(starts)]


def cost_per_save(epoch_seconds: list[float]) -> float:
    """Seconds a save adds to an epoch, within one "W" run (a save after every other epoch): the median epoch that
    ends with one minus the median that does not, the first two epochs (warm-up) left out."""
    saving = [s for i, s in enumerate(epoch_seconds) if i >= 2 and i % 2 == 1]
    plain = [s for i, s in enumerate(epoch_seconds) if i >= 2 and i % 2 == 0]
    return statistics.median(saving) - statistics.median(plain)


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
    parser.add_argument("--within-run", action="store_true", help="add W: 2 x epochs, a save after every other "
                        "epoch; what a save costs an epoch, measured within each run")
    args = parser.parse_args()
    arms = ["A", "B", *(["S"] if args.with_sync else []), *(["U"] if args.with_unpacked else []),
            *(["G"] if args.with_guard_what_if else []), *(["W"] if args.within_run else [])]
    print(f"load average (1 min) {load()}; A = default checkpointing, B = --trainer.enable_checkpointing false"
          + (", S = synchronous, two files" if args.with_sync else "")
          + (", U = A with the tensors pickled one by one" if args.with_unpacked else "")
          + (", G = A with the guard checking trainable tensors only" if args.with_guard_what_if else "")
          + (", W = a save after every other epoch" if args.within_run else "")
          + f"; {args.epochs} one-step epochs, validation off; rounds alternate the order (A B .. then .. B A)",
          flush=True)
    timed_run(1, "A")  # warm-up: file caches, imports; not counted
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    epochs: dict[str, list[float]] = {arm: [] for arm in arms}
    saves: list[float] = []
    for pair in range(1, args.pairs + 1):
        for arm in arms if pair % 2 else arms[::-1]:  # a drift over the sitting favours no arm
            wall, seconds = timed_run(2 * args.epochs if arm == "W" else args.epochs, arm)
            walls[arm].append(wall)
            epochs[arm].append(statistics.median(seconds))
            if arm == "W":
                saves.append(cost_per_save(seconds))
        print(f"round {pair}: " + ", ".join(f"{arm} {walls[arm][-1]:.2f} s (median epoch {1000 * epochs[arm][-1]:.1f} "
                                            "ms)" for arm in arms if arm != "W")
              + "; " + ", ".join(f"{arm}/B {walls[arm][-1] / walls['B'][-1]:.3f}" for arm in arms if arm not in "BW")
              + (f"; W: a save adds {1000 * saves[-1]:+.1f} ms to its epoch" if saves else "")
              + f" (load {load()})", flush=True)
    for arm in (arm for arm in arms if arm not in "BW"):
        ratios = [a / b for a, b in zip(walls[arm], walls["B"])]
        epoch, base = statistics.median(epochs[arm]), statistics.median(epochs["B"])
        print(f"{arm}/B: median wall ratio {statistics.median(ratios):.3f}; median epoch {1000 * epoch:.1f} ms vs "
              f"{1000 * base:.1f} ms ({epoch / base:.3f}x, {1000 * (epoch - base):+.1f} ms per epoch)")
    if saves:
        cost, base_wall = statistics.median(saves), statistics.median(walls["B"])
        print(f"W: a save adds {1000 * cost:.1f} ms to its epoch (median of {len(saves)} runs: "
              + ", ".join(f"{1000 * s:.1f}" for s in saves) + f"); {args.epochs} saves over B's median wall "
              f"{base_wall:.2f} s: a ratio of {1 + args.epochs * cost / base_wall:.3f}")
    print(f"load average (1 min) {load()}")


if __name__ == "__main__":
    main()
