"""The loss family on the quickstart workload: held-out accuracy gain, seconds per epoch and peak RSS per variant.

Every variant generates the same budget of 5,120 completions (``--data.completion_budget``) from the shipped tiny
model, for each seed: 20 epochs of 32 prompts x 8 completions, except DAPO, whose dynamic sampling spends part of
the budget on replacement draws for flat groups and so trains fewer epochs. Accuracy is greedy on the 1,000 held-out
addition problems, before training and after the run's last epoch. "s / epoch" is the whole run's wall time (model
load and validations included) over the epochs trained. Runs go one at a time (2 cores).

    .venv/bin/python benchmarks/research/objectives/variants.py [--seeds 0 1 2] [--only grpo ppo]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import fit_command, held_out_accuracies, run_child  # noqa: E402

QUICKSTART = ["--config", "configs/quickstart.yaml"]
VARIANTS: dict[str, list[str]] = {
    "GRPO": QUICKSTART,
    "Dr. GRPO": QUICKSTART + ["--model.advantage_mode", "drgrpo", "--model.aggregation", "constant"],
    "DAPO": ["--config", "configs/dapo.yaml"],
    "GSPO": QUICKSTART + ["--model.loss_variant", "gspo", "--model.clip.eps", "null"],
    "RLOO": QUICKSTART + ["--model.advantage_mode", "rloo"],
    "REINFORCE": QUICKSTART + ["--model.loss_variant", "reinforce", "--model.advantage_mode", "centered"],
    "PPO": ["--config", "configs/ppo.yaml"],
    "online DPO": ["--config", "configs/dpo_online.yaml"],
}
BUDGET = 5120
STOP = re.compile(r"completion budget spent \((\d+) generated\): stopping after epoch (\d+)")


def run(args: list[str], seed: int) -> dict[str, float]:
    command = fit_command(args, seed, f"/tmp/lit-grpo-variants/{seed}", then=[
        "--data.completion_budget", str(BUDGET), "--trainer.max_epochs", "100"])
    done = run_child(command, cwd=ROOT).checked(" ".join(args))
    generated, last_epoch = map(int, STOP.search(done.output).groups())
    before, after = held_out_accuracies(done.output, last_epoch)
    return {"gain": 100 * (after - before), "epochs": last_epoch + 1,
            "seconds_per_epoch": done.seconds / (last_epoch + 1), "rss_mb": done.peak_rss_bytes / 2**20,
            "completions": generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    options = parser.parse_args()
    print("| variant | accuracy gain, points (mean ± sd over seeds) | per seed | completions | epochs | s / epoch | "
          "peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for name, args in VARIANTS.items():
        if options.only and name not in options.only:
            continue
        results = [run(args, seed) for seed in options.seeds]
        gains = [r["gain"] for r in results]
        spread = statistics.pstdev(gains) if len(gains) > 1 else 0.0
        per_seed = ", ".join(f"{g:+.1f}" for g in gains)
        epochs = "/".join(sorted({str(r["epochs"]) for r in results}))
        completions = "/".join(sorted({str(r["completions"]) for r in results}))
        print(f"| {name} | {statistics.mean(gains):+.1f} ± {spread:.1f} | {per_seed} | {completions} | {epochs} | "
              f"{statistics.median(r['seconds_per_epoch'] for r in results):.2f} | "
              f"{max(r['rss_mb'] for r in results):.0f} |", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
