"""The loss family on the quickstart workload: held-out accuracy gain, seconds per epoch and peak RSS per variant.

Every variant trains 20 epochs of 32 prompts x 8 completions (5,120 sampled completions; DAPO's dynamic sampling
draws more prompts to replace flat groups, so its budget is larger) from the shipped tiny model, for each seed;
accuracy is greedy on the 1,000 held-out addition problems, before and after. "s / epoch" is the whole run's wall
time (model load and two validations included) over 20. Runs go one at a time (2 cores).

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
ACCURACY = re.compile(r"(before training|after epoch 19): .*val/accuracy ([0-9.]+)")
EPOCH = re.compile(r"^epoch \d+: .* in ([0-9.]+)s", re.M)


def run(args: list[str], seed: int) -> dict[str, float]:
    command = ["/usr/bin/time", "-f", "MAXRSS %M", str(ROOT / ".venv" / "bin" / "lit-grpo"), "fit", *args,
               "--seed_everything", str(seed), "--data.seed", str(seed), "--trainer.logger", "false",
               "--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false",
               "--trainer.default_root_dir", f"/tmp/lit-grpo-variants/{seed}"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    text = result.stdout + result.stderr
    found = dict((stage, float(value)) for stage, value in ACCURACY.findall(text))
    rss = int(re.search(r"MAXRSS (\d+)", text).group(1)) / 1024
    return {"gain": 100 * (found["after epoch 19"] - found["before training"]), "seconds_per_epoch": wall / 20,
            "rss_mb": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="variant names to run (default: all)")
    options = parser.parse_args()
    print("| variant | accuracy gain, points (mean ± sd over seeds) | per seed | s / epoch | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, args in VARIANTS.items():
        if options.only and name not in options.only:
            continue
        results = [run(args, seed) for seed in options.seeds]
        gains = [r["gain"] for r in results]
        spread = statistics.pstdev(gains) if len(gains) > 1 else 0.0
        per_seed = ", ".join(f"{g:+.1f}" for g in gains)
        print(f"| {name} | {statistics.mean(gains):+.1f} ± {spread:.1f} | {per_seed} | "
              f"{statistics.median(r['seconds_per_epoch'] for r in results):.2f} | "
              f"{max(r['rss_mb'] for r in results):.0f} |", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
