"""The risk rule against the optimal-stopping tree policy on the clarification game, at the same training budget.

Trains ``configs/clarify_risk.yaml`` (tau calibrated for alpha = 0.1 on held-out prompts 0-499 at each validation)
and ``configs/clarify_tree.yaml`` with ``tree_value_mode: optimal_stopping`` (30 epochs of 16 prompts each, the
same seed), then plays greedy episodes of held-out prompts 500-999, which neither run saw, and prints coverage
(episodes that end in an answer the policy chose), selective error (wrong among those), mean return, and for the
risk run the head's expected calibration error at the decisions it let through, and the risk-coverage curve.

    .venv/bin/python benchmarks/risk.py [--epochs 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

from lit_grpo.cli import LitGRPOCLI
from lit_grpo.risk import expected_calibration_error
from lit_grpo.risk_rollout import rule_outcome

TEST = slice(500, 1000)


def fit(config: str, epochs: int, seed: int, extra: list[str]) -> tuple[LitGRPOCLI, float]:
    args = ["--config", config, "--trainer.max_epochs", str(epochs), "--seed_everything", str(seed),
            "--data.seed", str(seed), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.default_root_dir", f"/tmp/lit-grpo-risk/{config.split('/')[-1]}",
            # a shared engine outlives the fit, for the test episodes afterwards
            "--data.engine", "lit_grpo.engines.HFEngine", "--data.engine.init_args.shared", "true", *extra]
    cli = LitGRPOCLI(args=args, run=False)
    started = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli, time.perf_counter() - started


def row(name: str, outcome, segments: int, seconds: float, ece: str = "—") -> str:
    error = "undefined" if outcome.selective_error is None else f"{outcome.selective_error:.3f}"
    return (f"| {name} | {outcome.coverage:.3f} | {error} | {float(outcome.returns.mean()):.3f} | {ece} | "
            f"{segments} | {seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    risk, risk_seconds = fit("configs/clarify_risk.yaml", options.epochs, options.seed, [])
    threshold = next(c for c in risk.trainer.callbacks if type(c).__name__ == "RiskThreshold")
    tau = threshold.current_tau(risk.trainer.current_epoch)
    records = list(risk.datamodule.task.heldout_records())[TEST]
    ruled = rule_outcome(risk.model, risk.datamodule, records, tau)
    free = rule_outcome(risk.model, risk.datamodule, records, None, apply_rule=False)
    curve = [rule_outcome(risk.model, risk.datamodule, records, t) for t in threshold.candidates]
    ece = expected_calibration_error(ruled.decision_p_error, ruled.decision_error)
    tree, tree_seconds = fit("configs/clarify_tree.yaml", options.epochs, options.seed,
                             ["--model.tree_value_mode", "optimal_stopping"])
    baseline = rule_outcome(tree.model, tree.datamodule, records, None, apply_rule=False)
    print(f"\n{len(records)} held-out episodes (prompts 500-999); tau calibrated on prompts 0-499 for alpha "
          f"{threshold.alpha}: {'always defer' if tau is None else f'{tau:g}'}")
    print("| policy | coverage | selective error | mean return | ECE | segments generated | train s |")
    print("|---|---|---|---|---|---|---|")
    segments = risk.datamodule.completions_generated
    print(row(f"risk rule (tau {tau})", ruled, segments, risk_seconds, f"{ece:.3f}"))
    print(row("same policy, rule off", free, segments, risk_seconds))
    print(row("optimal-stopping tree policy", baseline, tree.datamodule.completions_generated, tree_seconds))
    print("\nrisk-coverage on the test episodes (tau: coverage, selective error): " + ", ".join(
        f"{o.tau:g}: {o.coverage:.2f}, {'—' if o.selective_error is None else f'{o.selective_error:.3f}'}"
        for o in curve))


if __name__ == "__main__":
    main()
