"""Memory soak (issue 10): arith-bench for 200 optimizer steps (epochs) with validation off; the process's peak RSS
after epoch 10 and after epoch 200, and its growth in between (done when < 5%).

    flock /tmp/heavy.lock .venv/bin/python benchmarks/memory/rss_soak.py [--epochs 200] [--padded]
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, for benchmarks.*
from benchmarks.speed.step_time import lit_run  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


class RssLog(pl.Callback):
    """Peak and current RSS after every training epoch."""

    def __init__(self) -> None:
        self.peak: list[float] = []
        self.current: list[float] = []

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        self.peak.append(peak_rss_mb())
        self.current.append(current_rss_mb())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--padded", action="store_true", help="the padded forward instead of the packed one")
    options = parser.parse_args()
    log = RssLog()
    seconds = lit_run("arith-bench", not options.padded, options.epochs, callbacks=(log,))
    print(f"arith-bench, {options.epochs} epochs, {'padded' if options.padded else 'packed'} forward, "
          f"validation off: {seconds:.3f} s / step")
    print("| after epoch | peak RSS MB | current RSS MB |")
    print("|---|---|---|")
    for epoch in sorted({1, 10, 50, 100, 150, options.epochs} & set(range(1, options.epochs + 1))):
        print(f"| {epoch} | {log.peak[epoch - 1]:.1f} | {log.current[epoch - 1]:.1f} |")
    growth = 100 * (log.peak[-1] / log.peak[9] - 1)
    print(f"peak RSS growth from epoch 10 to {options.epochs}: {growth:+.2f}% (done when < 5%)")


if __name__ == "__main__":
    main()
