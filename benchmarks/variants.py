"""The loss family on the quickstart workload: held-out accuracy gain, seconds per epoch and peak RSS per variant.

Every variant generates the same budget of 5,120 completions (``--data.completion_budget``) from the shipped tiny
model, for each seed: 20 epochs of 32 prompts x 8 completions, except DAPO, whose dynamic sampling spends part of
the budget on replacement draws for flat groups and so trains fewer epochs. Accuracy is greedy on the 1,000 held-out
addition problems, before training and after the run's last epoch. "s / epoch" is the whole run's wall time (model
load and validations included) over the epochs trained. Runs go one at a time (2 cores).

    .venv/bin/python benchmarks/variants.py [--seeds 0 1 2] [--only grpo ppo]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ["--config", "configs/quickstart.yaml"]
VARIANTS: dict[str, list[str]] = {
    "GRPO": QUICKSTART,
    "Dr. GRPO": QUICKSTART + ["--model.advantage_mode", "drgrpo", "--model.aggregation", "constant"],
    "DAPO": ["--config", "configs/dapo.yaml"],
    "GSPO": QUICKSTART + ["--model.loss_variant", "gspo", "--model.clip_eps", "null"],
    "RLOO": QUICKSTART + ["--model.advantage_mode", "rloo"],
    "REINFORCE": QUICKSTART + ["--model.loss_variant", "reinforce", "--model.advantage_mode", "centered"],
    "PPO": ["--config", "configs/ppo.yaml"],
    "online DPO": ["--config", "configs/dpo_online.yaml"],
}
BUDGET = 5120
ACCURACY = re.compile(r"(before training|after epoch \d+): .*val/accuracy ([0-9.]+)")
STOP = re.compile(r"completion budget spent \((\d+) generated\): stopping after epoch (\d+)")


def run(args: list[str], seed: int) -> dict[str, float]:
    command = ["/usr/bin/time", "-f", "MAXRSS %M", str(ROOT / ".venv" / "bin" / "lit-grpo"), "fit", *args,
               "--seed_everything", str(seed), "--data.seed", str(seed), "--trainer.logger", "false",
               "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
               "--data.completion_budget", str(BUDGET), "--trainer.max_epochs", "100",
               "--trainer.default_root_dir", f"/tmp/lit-grpo-variants/{seed}"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    text = result.stdout + result.stderr
    accuracies = ACCURACY.findall(text)
    generated, last_epoch = map(int, STOP.search(text).groups())
    assert accuracies[0][0] == "before training" and accuracies[-1][0] == f"after epoch {last_epoch}", accuracies
    rss = int(re.search(r"MAXRSS (\d+)", text).group(1)) / 1024
    return {"gain": 100 * (float(accuracies[-1][1]) - float(accuracies[0][1])), "epochs": last_epoch + 1,
            "seconds_per_epoch": wall / (last_epoch + 1), "rss_mb": rss, "completions": generated}


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
