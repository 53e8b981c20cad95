"""What the per-epoch checkpoint costs a run (issues 34, 40): the quickstart cut to one optimizer step per epoch
(8 prompts x 8 completions = one minibatch of 64), 60 epochs, validation off, with the command's default
checkpointing (A: Lightning's checkpoint file, last.ckpt, written through AsyncCheckpointIO beside its target and
renamed) and with ``--trainer.enable_checkpointing false`` (B). Each run is a whole ``lit-grpo fit`` process in its
own temporary directory, the two alternate (A B A B A B after one uncounted warm-up run), and the script prints each
wall time, each round's ratio A / B and their median.

Each run also records when each epoch starts (a callback added to the trainer); the median epoch, from one epoch's
start to the next's (the checkpoint written in between), is printed too: on a shared machine a burst of other work
stretches a few epochs of one run and moves its wall time by more than the checkpoint costs, and the median of 59
epochs is not moved by it. The 1-minute load average is printed before, after and with each round. The order of the
arms is reversed every other round, so that a drift of the machine's speed over the sitting favours none.

``--with-sync`` adds a third run to each round, S: Lightning's plain ``TorchCheckpointIO`` (written on the training
thread through an fsspec transaction). ``--within-run`` adds W: twice the epochs with a save after every other one;
the median epoch that ends with a save minus the median that does not, within each run, is what a save costs, free
of the drift between runs that moves each wall time by more than the checkpoint costs (±10% here).

``--spinning`` adds As and Bs: A and B with torch's idle OpenMP threads spinning, libgomp's default (torch is
imported before ``lit_grpo.cli``, so the command's ``OMP_WAIT_POLICY=PASSIVE`` comes too late;
``lit_grpo/cli/idle_threads.py``); Bs / B is what the policy costs or saves a run without checkpoints.

``--release-width`` measures instead what a save costs at release width against one training step there: the
random 2-layer Qwen2 of Qwen2.5-0.5B's width (hidden 896, vocabulary 151,936; ``benchmarks/memory/memory.py`` builds it
once under ``--model-dir``), LoRA r 16, alpha 32 on every linear layer as the release configs have it, a bf16 base,
``--release-tokens`` completion tokens x 8 rows, AdamW; a step is ``memory.py``'s configuration d. The checkpoint
is what Lightning writes for it (the adapter, AdamW's two moments of each of its tensors, the loop counters). It
prints the median step, the time the training thread spends in a background save (the clone) and a whole
synchronous write, each as a share of a step.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/checkpoint_cost.py [--pairs 3] [--epochs 60] [--with-sync]
        [--within-run] [--spinning]
    flock /tmp/heavy.lock .venv/bin/python benchmarks/speed/checkpoint_cost.py --release-width [--release-tokens 512]
        [--release-steps 5] [--release-saves 5] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import run_child, with_checkout_on_path  # noqa: E402

SPINNING = """
import os
os.environ.pop("OMP_WAIT_POLICY", None)
import torch  # loaded before lit_grpo.cli: libgomp's default wait policy, the threads spin (the command before)
"""
COMMAND = """
import lit_grpo.cli  # (after SPINNING) it sets the OpenMP wait policy before torch loads (lit_grpo/cli/idle_threads.py)
"""
SYNC = """
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
lit_grpo.cli.command.BackgroundCheckpointIO = TorchCheckpointIO  # Lightning's own, on the training thread
"""


def command(epochs: int, arm: str, clock: Path) -> list[str]:
    """``arm``: "A" default checkpointing, "B" none, "S" Lightning's synchronous TorchCheckpointIO, "W" A saving
    after every other epoch; "As", "Bs": A and B with torch's OpenMP threads spinning when idle. Each epoch's start
    goes to ``clock`` (``benchmarks.speed.clocks.EpochClock``, named by class path)."""
    program = (SPINNING if arm.endswith("s") else "") + COMMAND + {"S": SYNC}.get(arm, "") + "lit_grpo.cli.main()"
    epoch_clock = json.dumps({"class_path": "benchmarks.speed.clocks.EpochClock", "init_args": {"path": str(clock)}})
    arm = arm.removesuffix("s")
    return [sys.executable, "-c", program, "fit",
            "--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.max_epochs", str(epochs),
            "--data.prompts_per_epoch", "8", "--data.minibatch_size", "64", "--trainer.limit_val_batches", "0",
            "--trainer.enable_progress_bar", "false", f"--trainer.callbacks+={epoch_clock}",
            *{"B": ["--trainer.enable_checkpointing", "false"],
              "W": ["--checkpoint.every_n_epochs", "2"]}.get(arm, [])]


def timed_run(epochs: int, arm: str) -> tuple[float, list[float]]:
    """Wall seconds of one whole ``lit-grpo fit`` process in a fresh directory and its epochs' seconds (from one
    epoch's start to the next's, the checkpoint written in between); checks what it left there."""
    with tempfile.TemporaryDirectory(prefix="checkpoint-cost-") as run_dir:
        clock = Path(run_dir) / "clock.json"
        done = run_child(command(epochs, arm, clock), cwd=run_dir, env=with_checkout_on_path(), merge_stderr=True)
        if done.returncode != 0:
            sys.exit(f"lit-grpo fit failed ({done.returncode}):\n{done.stdout[-3000:]}")
        written = sorted(p.name for p in Path(run_dir).rglob("*.ckpt"))
        expected = [] if arm.startswith("B") else ["last.ckpt"]
        if written != expected:
            sys.exit(f"expected checkpoints {expected}, found {written}")
        starts = json.loads(clock.read_text())
    return done.seconds, [b - a for a, b in itertools.pairwise(starts)]


def cost_per_save(epoch_seconds: list[float]) -> float:
    """Seconds a save adds to an epoch, within one "W" run (a save after every other epoch): the median epoch that
    ends with one minus the median that does not, the first two epochs (warm-up) left out."""
    saving = [s for i, s in enumerate(epoch_seconds) if i >= 2 and i % 2 == 1]
    plain = [s for i, s in enumerate(epoch_seconds) if i >= 2 and i % 2 == 0]
    return statistics.median(saving) - statistics.median(plain)


def release_checkpoint(policy: Any) -> dict[str, Any]:
    """What ``Trainer.save_checkpoint`` holds for a PolicyModule of ``policy``: the trained weights, AdamW's state of
    each (step, two moments), the loop counters."""
    import lightning.pytorch as pl
    import torch

    trained = {f"policy.{name}": p.detach() for name, p in policy.named_parameters() if p.requires_grad}
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.randn_like(p), "exp_avg_sq": torch.rand_like(p)}
             for i, p in enumerate(trained.values())}
    groups = [{"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": list(state)}]
    return {"epoch": 0, "global_step": 1, "pytorch-lightning_version": pl.__version__, "state_dict": trained,
            "optimizer_states": [{"state": state, "param_groups": groups}], "lr_schedulers": [], "loops": {},
            "callbacks": {}, "hyper_parameters": {"lora": {"rank": 16}}}


def release_width(model_dir: Path, tokens: int, steps: int, saves: int) -> None:
    """A save against a step at release width (module docstring)."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.memory import memory

    from lit_grpo.cli.checkpoint_io import BackgroundCheckpointIO, BesideTargetCheckpointIO
    from lit_grpo.run.host_memory import return_freed_memory

    return_freed_memory()  # as the command does
    step, policy = memory.lit_step("d", memory.model_path(model_dir, 2), tokens)
    step()  # the first step allocates the optimizer state
    step_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        step_seconds.append(time.perf_counter() - started)
    checkpoint = release_checkpoint(policy)
    on_thread, synchronous = [], []
    with tempfile.TemporaryDirectory(prefix="checkpoint-cost-release-") as directory:
        target = Path(directory) / "last.ckpt"
        background, plain = BackgroundCheckpointIO(), BesideTargetCheckpointIO()
        for _ in range(saves):
            started = time.perf_counter()
            background.save_checkpoint(checkpoint, target)  # what the training thread waits for
            on_thread.append(time.perf_counter() - started)
            background.wait()
            started = time.perf_counter()
            plain.save_checkpoint(checkpoint, target)
            synchronous.append(time.perf_counter() - started)
        size = target.stat().st_size
    step_s, thread_s, sync_s = (statistics.median(x) for x in (step_seconds, on_thread, synchronous))
    print(f"release width (2 layers, hidden 896, vocabulary 151,936; LoRA r 16 on every linear layer, bf16 base, "
          f"{tokens} tokens x 8 rows); checkpoint {size / 2**20:.1f} MB; load average (1 min) {load()}")
    print(f"one step {step_s:.3f} s (median of {steps}); a background save on the training thread "
          f"{1000 * thread_s:.1f} ms = {thread_s / step_s:.2%} of a step; a synchronous write {1000 * sync_s:.1f} ms "
          f"= {sync_s / step_s:.2%} of a step (medians of {saves})")


BASE = {"A": "B", "S": "B", "As": "Bs", "Bs": "B"}  # each ratio arm and the arm it is divided by


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--with-sync", action="store_true", help="add S, Lightning's synchronous TorchCheckpointIO")
    parser.add_argument("--within-run", action="store_true", help="add W: 2 x epochs, a save after every other "
                        "epoch; what a save costs an epoch, measured within each run")
    parser.add_argument("--spinning", action="store_true", help="add As and Bs: A and B with torch's idle OpenMP "
                        "threads spinning (libgomp's default; the command sets OMP_WAIT_POLICY=PASSIVE)")
    parser.add_argument("--release-width", action="store_true", help="a save against a step at release width")
    parser.add_argument("--release-tokens", type=int, default=512)
    parser.add_argument("--release-steps", type=int, default=5)
    parser.add_argument("--release-saves", type=int, default=5)
    parser.add_argument("--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "lit-grpo-memory-models")
    args = parser.parse_args()
    if args.release_width:
        return release_width(args.model_dir, args.release_tokens, args.release_steps, args.release_saves)
    arms = ["A", "B", *(["S"] if args.with_sync else []), *(["W"] if args.within_run else []),
            *(["As", "Bs"] if args.spinning else [])]
    print(f"load average (1 min) {load()}; A = default checkpointing, B = --trainer.enable_checkpointing false"
          + (", S = Lightning's synchronous TorchCheckpointIO" if args.with_sync else "")
          + (", W = a save after every other epoch" if args.within_run else "")
          + (", As/Bs = A/B with idle OpenMP threads spinning" if args.spinning else "")
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
              + "; " + ", ".join(f"{arm}/{BASE[arm]} {walls[arm][-1] / walls[BASE[arm]][-1]:.3f}"
                                 for arm in arms if arm in BASE)
              + (f"; W: a save adds {1000 * saves[-1]:+.1f} ms to its epoch" if saves else "")
              + f" (load {load()})", flush=True)
    for arm in (arm for arm in arms if arm in BASE):
        ratios = [a / b for a, b in zip(walls[arm], walls[BASE[arm]])]
        epoch, base = statistics.median(epochs[arm]), statistics.median(epochs[BASE[arm]])
        print(f"{arm}/{BASE[arm]}: median wall ratio {statistics.median(ratios):.3f}; median epoch {1000 * epoch:.1f} ms vs "
              f"{1000 * base:.1f} ms ({epoch / base:.3f}x, {1000 * (epoch - base):+.1f} ms per epoch)")
    if saves:
        cost, base_wall = statistics.median(saves), statistics.median(walls["B"])
        print(f"W: a save adds {1000 * cost:.1f} ms to its epoch (median of {len(saves)} runs: "
              + ", ".join(f"{1000 * s:.1f}" for s in saves) + f"); {args.epochs} saves over B's median wall "
              f"{base_wall:.2f} s: a ratio of {1 + args.epochs * cost / base_wall:.3f}")
    print(f"load average (1 min) {load()}")


if __name__ == "__main__":
    main()
