"""The objectives a TRL 1.16 user sets (issue 50) beside GRPO, Dr. GRPO, DAPO and GSPO, in one off-policy setting:
held-out accuracy after 20 epochs, and the share of tokens each mechanism acted on.

The setting is the quickstart workload (the shipped tiny model, two-digit addition, 32 prompts x 8 completions an
epoch, minibatches of 64: four optimizer steps an epoch) with two passes over each epoch's rollouts (``ppo_epochs
2``), so that the ratio pi / pi_old leaves 1 after the first step and every clip, cap, gate and mask can act; no KL
term (TRL's default beta 0) for any row. Each row changes only its objective's knobs. Accuracy is greedy on the
1,000 held-out problems before training and after epoch 20. The mechanism column is the mean over the 20 epochs of
the training figure named beside it (``train/...``, logged to CSV). Runs go one at a time; accuracies do not depend
on the machine's load (deterministic runs), so no timing is reported here.

    .venv/bin/python benchmarks/research/objectives/objectives.py [--seeds 0 1 2] [--only CISPO SAPO] [--lr 0.001]
    .venv/bin/python benchmarks/research/objectives/objectives.py --sweep 0.00025 0.0005 0.001 --seeds 0  # a row each
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import fit_command, held_out_accuracies, run_child  # noqa: E402

BASE = ["--config", "configs/quickstart.yaml", "--data.ppo_epochs", "2", "--model.kl.coef", "0.0"]
CLIP = "clip_ratio/region_mean"
# name -> (arguments, the training figure that shows its mechanism acting)
OBJECTIVES: dict[str, tuple[list[str], str]] = {
    "GRPO": (BASE, CLIP),
    "Dr. GRPO": (BASE + ["--model.advantage_mode", "drgrpo", "--model.aggregation", "constant"], CLIP),
    "DAPO": (["--config", "configs/dapo.yaml", "--data.ppo_epochs", "2"], CLIP),
    "GSPO": (BASE + ["--model.loss_variant", "gspo", "--model.clip.eps", "null", "--model.aggregation", "null"], CLIP),
    "CISPO (configs/cispo.yaml)": (["--config", "configs/cispo.yaml"], "cispo_clip_ratio"),
    "CISPO, cap 2 (clip_eps_high 1)": (["--config", "configs/cispo.yaml", "--model.clip.eps_high", "1.0"],
                                       "cispo_clip_ratio"),
    "SAPO (configs/sapo.yaml)": (["--config", "configs/sapo.yaml"], "sapo/gate_mean"),
    "LUSPO": (BASE + ["--model.loss_variant", "luspo", "--model.clip.eps", "null", "--model.aggregation", "null"],
              CLIP),
    "VESPO": (BASE + ["--model.loss_variant", "vespo", "--model.aggregation", "null"], "vespo/phi_seq_mean"),
    "GRPO without the clip (unclipped)": (BASE + ["--model.loss_variant", "unclipped"], "ratio_mean"),
    "GRPO + two-sided clip (delta 1.5)": (BASE + ["--model.clip.delta", "1.5"], "clip_ratio/delta_mean"),
    "GRPO + sequence-level ratio": (BASE + ["--model.ratio_level", "sequence"], CLIP),
    "GRPO + off-policy mask (0.02)": (BASE + ["--model.off_policy_mask_threshold", "0.02"],
                                      "off_policy_mask/masked_ratio"),
    "GRPO + top-20% entropy tokens": (BASE + ["--model.entropy", '{"top_quantile": 0.2}'], "entropy"),
}


def run(args: list[str], seed: int, figure: str) -> dict[str, float]:
    root = Path(f"/tmp/lit-grpo-objectives/{seed}")
    shutil.rmtree(root, ignore_errors=True)
    csv_logger = ["--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(root)]
    command = fit_command(args, seed, root, csv_logger, ["--trainer.max_epochs", "20",
                                                         "--trainer.check_val_every_n_epoch", "20"])
    done = run_child(command, cwd=ROOT).checked(" ".join(args))
    before, after = held_out_accuracies(done.output, last_epoch=19)
    (log,) = root.glob("**/metrics.csv")
    with log.open() as handle:
        values = [float(row[f"train/{figure}"]) for row in csv.DictReader(handle) if row.get(f"train/{figure}")]
    return {"before": before, "after": after, "figure": statistics.mean(values) if values else float("nan")}


def sweep(rates: list[float], seeds: list[int], only: list[str] | None) -> None:
    """Held-out accuracy after 20 epochs per learning rate (mean over ``seeds``), each objective's best marked."""
    print("| objective | " + " | ".join(f"lr {rate:g}" for rate in rates) + " | best |")
    print("|---|" + "---|" * (len(rates) + 1))
    for name, (args, figure) in OBJECTIVES.items():
        if only and name not in only:
            continue
        means = [statistics.mean(run(args + ["--model.optimizer.init_args.lr", str(rate)], seed, figure)["after"]
                                 for seed in seeds) for rate in rates]
        best = max(range(len(rates)), key=lambda i: means[i])
        print(f"| {name} | " + " | ".join(f"{m:.3f}" for m in means) + f" | {rates[best]:g} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="*", default=None, help="objective names to run (default: all)")
    parser.add_argument("--lr", type=float, default=None, help="the learning rate of every row (default: 5e-4)")
    parser.add_argument("--sweep", type=float, nargs="+", default=None, help="learning rates to compare instead")
    parser.add_argument("--figure", default=None, help="another training figure for the mechanism column")
    options = parser.parse_args()
    if options.sweep:
        sweep(options.sweep, options.seeds, options.only)
        return
    extra = [] if options.lr is None else ["--model.optimizer.init_args.lr", str(options.lr)]
    print("| objective | held-out accuracy after 20 epochs: mean ± sd (per seed) | before | mechanism: mean over "
          "epochs (per seed) |")
    print("|---|---|---|---|")
    for name, (args, figure) in OBJECTIVES.items():
        if options.only and name not in options.only:
            continue
        figure = options.figure or figure
        results = [run(args + extra, seed, figure) for seed in options.seeds]
        after = [r["after"] for r in results]
        spread = statistics.stdev(after) if len(after) > 1 else 0.0
        shares = [r["figure"] for r in results]
        print(f"| {name} | {statistics.mean(after):.3f} ± {spread:.3f} ({', '.join(f'{a:.3f}' for a in after)}) | "
              f"{results[0]['before']:.3f} | `{figure}` {statistics.mean(shares):.3g} "
              f"({', '.join(f'{v:.3g}' for v in shares)}) |", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
