"""Does the risk head know when the policy will be wrong? The head against the policy's own confidence, on the
hidden-operands game, over seeds (issue 21).

Per seed: train ``configs/hidden_risk.yaml`` (the optimal-stopping tree policy with the detached head, fitted on
greedy probes; the rule off in training, so the policy is exactly the tree policy of that seed) to its 4,000-
segment budget; play the 500 held-out prompts greedily with the rule off and, at every answer decision, score the
head's P(error) and the baselines (1 - first-token probability, first-token entropy, minus the greedy answer's
log-prob, 1 - its smallest token probability, disagreement of 8 sampled answers, a logistic probe cross-fitted on
the frozen hidden states, the "information still hidden" flag); then play the same prompts under each rule (the
head's threshold over the tau grid, the value rule at several CVaR levels, a first-token-probability rule) for
return against questions asked. Finished seeds are appended to ``benchmarks/results/risk.jsonl`` and skipped on
re-run; the report (AUROC, AURC, E-AURC, selective error at coverage 0.8 / 0.9, overall and in informed states;
ECE over 15 equal-mass bins and Brier; the rules' returns; Learn-then-Test over 200 re-splits; paired bootstrap
intervals) and ``docs/risk_*.png`` come from the rows.

    .venv/bin/python benchmarks/research/risk/risk.py [--seeds 0 1 2] [--alpha 0.05] [--delta 0.1]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from lit_grpo.cli import LitGRPOCLI  # noqa: E402
from lit_grpo.engines import SamplingSpec  # noqa: E402
from lit_grpo.risk.rule import RiskRule  # noqa: E402
from benchmarks.research.risk.risk_report import report  # noqa: E402
from benchmarks.result_rows import append_row, read_rows  # noqa: E402
from benchmarks.research.risk.risk_signals import LogProbRule, answer_decisions, decision_scores, play  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "risk.jsonl"
TAUS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
CVAR_LEVELS = (0.0, 0.3, 0.6)
THETAS = (0.5, 0.7, 0.9, 0.95, 0.99)
ROUNDS = 3


def train(seed: int) -> LitGRPOCLI:
    args = ["--config", "configs/hidden_risk.yaml", "--seed_everything", str(seed), "--data.seed", str(seed),
            "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.check_val_every_n_epoch", "100000", "--trainer.enable_checkpointing", "false",
            "--trainer.default_root_dir", f"/tmp/lit-grpo-risk/seed{seed}",
            # a shared engine outlives the fit, for the held-out episodes afterwards
            "--data.engine", "lit_grpo.engines.HFEngine", "--data.engine.init_args.shared", "true"]
    cli = LitGRPOCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def evaluate(cli: LitGRPOCLI, seed: int) -> dict:
    module, datamodule = cli.model, cli.datamodule
    task, engine, tokenizer = datamodule.task, datamodule.engine, module.tokenizer
    datamodule.sync_policy(module)
    module.policy.eval()
    records = list(task.heldout_records())[:500]  # the game's own held-out prompts (the warm start never saw them)
    spec = SamplingSpec(max_new_tokens=datamodule.max_new_tokens, greedy=True, stop_token_ids=module.stop_token_ids)
    decisions = answer_decisions(task, engine, tokenizer, records, ROUNDS, spec)
    scores = decision_scores(module, engine, task, decisions, spec, seed)
    defer_ids, answer_ids = task.defer_token_ids(tokenizer), task.answer_token_ids(tokenizer)
    pad = tokenizer.pad_token_id

    def head_rule(tau: float | None, decision: str = "threshold", level: float = 0.0) -> RiskRule:
        return RiskRule(module.policy, module.risk_head, tau, defer_ids, pad, decision, level, answer_ids)

    rules = {"tree policy (rule off)": play(task, engine, tokenizer, records, ROUNDS, spec)}
    rules.update({f"head threshold tau={t:g}": play(task, engine, tokenizer, records, ROUNDS, spec, head_rule(t))
                  for t in TAUS})
    rules.update({f"head value rule cvar={c:g}": play(task, engine, tokenizer, records, ROUNDS, spec,
                                                      head_rule(None, "value", c)) for c in CVAR_LEVELS})
    rules.update({f"first-token rule theta={t:g}": play(task, engine, tokenizer, records, ROUNDS, spec,
                                                        LogProbRule(module.policy, defer_ids, pad, t))
                  for t in THETAS})
    oracle_asks = sum(task.oracle_questions(r) for r in records) / len(records)
    rules["oracle"] = {"return": task.oracle_return(records), "ask_rate": oracle_asks, "accuracy": 1.0}
    return {"errors": [d["error"] for d in decisions], "informed": [d["informed"] for d in decisions],
            "scores": {name: value.tolist() for name, value in scores.items()}, "rules": rules,
            "replay_rows": module.risk_fit_stats.get("replay_rows"), "fit_loss": module.risk_fit_stats.get("fit_loss"),
            "segments": datamodule.epoch_report.completions_generated}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--alpha", type=float, default=0.05, help="target selective error of Learn-then-Test")
    parser.add_argument("--delta", type=float, default=0.1, help="Learn-then-Test's level")
    parser.add_argument("--report-only", action="store_true")
    options = parser.parse_args()
    done = {row["seed"] for row in read_rows(RESULTS)}
    for seed in options.seeds:
        if options.report_only or seed in done:
            continue
        started = time.time()
        cli = train(seed)
        trained = time.time() - started
        row = {"seed": seed, **evaluate(cli, seed), "train_seconds": trained,
               "eval_seconds": time.time() - started - trained}
        cli.datamodule.engine.close()
        append_row(RESULTS, row)
        print(f"seed {seed}: trained in {trained:.0f}s, evaluated in {row['eval_seconds']:.0f}s", flush=True)
    rows = read_rows(RESULTS)
    report([r for r in rows if r["seed"] in options.seeds], options.alpha, options.delta, ROOT / "docs")


if __name__ == "__main__":
    main()
