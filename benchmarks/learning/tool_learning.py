"""The shipped tool configs learn (issue 48, item 6): held-out greedy return before and after
``lit-grpo fit --config configs/tools.yaml`` and ``configs/tools_tree.yaml``, 3 seeds, on the hf engine and the
in-process vLLM engine, with the malformed share of the sampled episodes at the first and the last epoch.

Each run is the config as shipped, changed only in the seed (``--seed_everything``, ``--data.seed``), the engine
(``--data.engine``) and the logger (a CSV file, read back here). "Before" is the run's own validation before
training (the warm start ``data/tiny-qwen2-tools``, greedy, the 100 validation rows); "after" its validation after
the last epoch. Intervals are t intervals (95 %, 2 degrees of freedom) over the seeds. One JSON line per run goes to
``benchmarks/results/tool_learning.jsonl``.

Run alone (one benchmark at a time):

    .venv/bin/python benchmarks/learning/tool_learning.py [--seeds 0 1 2] [--configs tools tools_tree] [--engines hf vllm]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.result_rows import append_row, read_rows  # noqa: E402
from benchmarks.timed_child import fit_command, run_child  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tool_learning.jsonl"
RETURN = re.compile(r"(before training|after epoch (\d+)): .*val/return (-?[0-9.]+)")
T_975_2DF = 4.303  # the t quantile for a 95 % interval over 3 seeds
ENGINES = {"hf": [], "vllm": ["--data.engine", "lit_grpo.engines.VLLMEngine", "--data.engine.init_args.dtype",
                              "float32", "--data.engine.init_args.kv_cache_gib", "1.0"]}


def run(config: str, engine: str, seed: int) -> dict[str, Any]:
    root = Path(f"/tmp/lit-grpo-tool-learning/{config}-{engine}-{seed}")
    csv_logger = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(root)]
    command = fit_command(["--config", f"configs/{config}.yaml"], seed, root, csv_logger, ENGINES[engine])
    done = run_child(command, cwd=ROOT).checked(f"{config} {engine} seed {seed}")
    seconds = done.seconds
    returns = [(int(epoch) if epoch else -1, float(value)) for _, epoch, value in RETURN.findall(done.stderr)]
    malformed = epoch_series(root, "tools/malformed_episodes")
    calls = epoch_series(root, "tools/call_frequency")
    return {"config": config, "engine": engine, "seed": seed, "seconds": round(seconds, 1),
            "before": returns[0][1], "after": returns[-1][1], "epochs": returns[-1][0] + 1,
            "malformed": malformed, "calls": calls}


def edge_means(series: list[float], epochs: int = 5) -> tuple[float, float]:
    """The means of a per-epoch series over its first and its last ``epochs`` epochs (one epoch's share of 64
    sampled episodes is too noisy to compare alone)."""
    return statistics.fmean(series[:epochs]), statistics.fmean(series[-epochs:])


def epoch_series(root: Path, name: str) -> list[float]:
    """The per-epoch values of ``name`` the run's CSV logger wrote, in order."""
    values = []
    for path in sorted(root.glob("**/metrics.csv")):
        with path.open() as handle:
            values += [float(row[name]) for row in csv.DictReader(handle) if row.get(name)]
    return values


def interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    half = T_975_2DF * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return mean, mean - half, mean + half


def report(runs: list[dict[str, Any]]) -> None:
    print("| config | engine | warm start return | after | gain, mean [95 % interval] | malformed episodes, first 5 "
          "epochs -> last 5 | tool calls per episode, first 5 -> last 5 | epochs | seconds (max) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted({(r["config"], r["engine"]) for r in runs}):
        group = [r for r in runs if (r["config"], r["engine"]) == key]
        gain, low, high = interval([r["after"] - r["before"] for r in group])
        mean = lambda name: statistics.fmean(r[name] for r in group)  # noqa: E731 - a column's mean
        malformed = [edge_means(r["malformed"]) for r in group]
        calls = [edge_means(r["calls"]) for r in group]
        print(f"| {key[0]} | {key[1]} | {mean('before'):.3f} | {mean('after'):.3f} | {gain:+.3f} "
              f"[{low:+.3f}, {high:+.3f}] | {statistics.fmean(m[0] for m in malformed):.3f} -> "
              f"{statistics.fmean(m[1] for m in malformed):.3f} (fewer in {sum(m[1] < m[0] for m in malformed)} of "
              f"{len(group)} seeds) | {statistics.fmean(c[0] for c in calls):.2f} -> "
              f"{statistics.fmean(c[1] for c in calls):.2f} | {mean('epochs'):.0f} | "
              f"{mean('seconds'):.0f} ({max(r['seconds'] for r in group):.0f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--configs", nargs="+", default=["tools", "tools_tree"])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=sorted(ENGINES))
    parser.add_argument("--report", action="store_true", help="only print the table of the results file's runs")
    options = parser.parse_args()
    if options.report:
        report(read_rows(RESULTS))
        return
    runs = []
    for engine in options.engines:
        for config in options.configs:
            for seed in options.seeds:
                result = run(config, engine, seed)
                print(json.dumps(result), flush=True)
                append_row(RESULTS, result)
                runs.append(result)
    report(runs)


if __name__ == "__main__":
    sys.exit(main())
