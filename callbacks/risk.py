"""RiskThreshold: owns the infer/defer threshold tau of the risk rule, calibrates it, and logs risk-coverage."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.buffers.protocols import PreparesEpochs, SamplingPolicy, TakesRiskThreshold
from lit_grpo.errors import InputError, refuse
from lit_grpo.risk.head import expected_calibration_error, learn_then_test
from lit_grpo.rollout.rule_outcomes import MeasuresRiskRule, RuleOutcome

DEFAULT_CANDIDATES = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0]


class RiskThreshold(pl.Callback):
    """The threshold tau of the risk rule (infer only if the risk head's P(error) <= tau, else defer), applied to
    training rollouts and to validation, and checkpointed.

    Args:
        mode: ``fixed`` (always ``tau``), ``scheduled`` (linear from ``tau_start`` at epoch 0 to ``tau`` at epoch
            ``schedule_epochs``, then ``tau``) or ``calibrated`` (``tau_start`` until the first validation; then,
            at every validation, the tau Learn-then-Test certifies on fresh greedy episodes of the held-out prompts:
            ``candidates`` tested from the smallest up, each null "selective error > alpha" rejected at level
            ``delta`` by an exact binomial p-value, the largest tau before the first failure; with probability at
            least 1 - delta its selective error on new prompts is at most alpha. If even the smallest fails, the
            explicit always-defer state, logged as ``risk/always_defer`` 1, in which validation defers everywhere
            while training rollouts grow free).
        tau: the fixed threshold, or the end of the schedule.
        tau_start: the threshold before the head has learned anything (1.0 lets the policy infer freely, so the
            head sees outcomes of inferring to learn from).
        schedule_epochs: epochs over which ``scheduled`` moves from ``tau_start`` to ``tau``.
        alpha: the target selective error (errors among inferred answers) of ``calibrated``.
        delta: the probability ``calibrated`` may miss ``alpha`` (the level of each test).
        decision: ``threshold`` (the rule above) or ``value``: at every decision, answer where the head's CVaR
            (at ``cvar_level``) of the return of answering is at least that of asking, ask otherwise (a forced
            answer or a forced question; tau, ``mode`` and the calibration play no part; the curve is still logged).
        cvar_level: the value rule's risk aversion: the CVaR of the worst ``1 - cvar_level`` of each return's
            distribution (0: its expectation).
        candidates: the grid of tau values ``calibrated`` tries; each is also a point of the risk-coverage curve
            logged at every validation (in every mode).
        explore_fraction: the share of each epoch's training prompts whose trees grow without the rule, so the
            head keeps seeing outcomes of inferring where the rule would forbid it (validation always applies it).
    """

    def __init__(
        self,
        mode: Literal["fixed", "scheduled", "calibrated"] = "calibrated",
        tau: float = 0.1,
        tau_start: float = 1.0,
        schedule_epochs: int = 10,
        alpha: float = 0.1,
        delta: float = 0.1,
        decision: Literal["threshold", "value"] = "threshold",
        cvar_level: float = 0.0,
        candidates: list[float] = DEFAULT_CANDIDATES,  # noqa: B006 - shown by --help; never mutated
        explore_fraction: float = 0.25,
    ) -> None:
        problems = []
        if mode not in ("fixed", "scheduled", "calibrated"):
            problems.append(f"mode: unknown value {mode!r}; valid choices: fixed, scheduled, calibrated")
        if decision not in ("threshold", "value"):
            problems.append(f"decision: unknown value {decision!r}; valid choices: threshold, value")
        for name, value in (("tau", tau), ("tau_start", tau_start), ("alpha", alpha), ("delta", delta),
                            ("explore_fraction", explore_fraction)):
            if not 0 <= value <= 1:
                problems.append(f"{name}: must be in [0, 1], got {value}")
        if not 0 <= cvar_level < 1:
            problems.append(f"cvar_level: must be in [0, 1), got {cvar_level}")
        if schedule_epochs < 1:
            problems.append(f"schedule_epochs: must be >= 1, got {schedule_epochs}")
        if not candidates or any(not 0 <= c <= 1 for c in candidates):
            problems.append(f"candidates: need at least one value, each in [0, 1], got {candidates}")
        refuse("invalid RiskThreshold configuration", problems)
        self.mode, self.tau_end, self.tau_start = mode, tau, tau_start
        self.schedule_epochs, self.alpha, self.candidates = schedule_epochs, alpha, sorted(candidates)
        self.delta, self.decision, self.cvar_level = delta, decision, cvar_level
        self.explore_fraction = explore_fraction
        self.calibrated_tau: float | None = tau_start

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        data = trainer.datamodule
        if data is None:
            return
        if not isinstance(data, TakesRiskThreshold):  # the rule would never apply: say so, not an AttributeError
            raise InputError(f"RiskThreshold: the trainer's data module ({type(data).__name__}) takes no risk "
                             "threshold (use_risk_threshold, lit_grpo.buffers.protocols.TakesRiskThreshold): use "
                             "lit_grpo.RolloutDataModule, or leave the callback out")
        if not isinstance(data, MeasuresRiskRule):  # the calibration and the curve would never run: say so
            raise InputError(f"RiskThreshold: the trainer's data module ({type(data).__name__}) does not measure the "
                             "rule on held-out prompts (val_records, rule_outcome: lit_grpo.rollout.rule_outcomes."
                             "MeasuresRiskRule): use lit_grpo.RolloutDataModule, or leave the callback out")
        # the rollouts' infer/defer rule reads its tau from here; the data module refuses a decision its task cannot
        # take (rules.risk_decision_problems)
        data.use_risk_threshold(self)

    def training_tau(self, epoch: int) -> float | None:
        """The tau of the training rollouts of ``epoch``: ``current_tau``, except that in the always-defer state
        they grow free (``tau_start``), since trees that never infer teach the head nothing."""
        tau = self.current_tau(epoch)
        return self.tau_start if tau is None else tau

    def current_tau(self, epoch: int) -> float | None:
        """The tau in force for the rollouts of ``epoch`` (and the validation after it); ``None``: always defer."""
        if self.mode == "fixed":
            return self.tau_end
        if self.mode == "scheduled":
            share = min(epoch / self.schedule_epochs, 1.0)
            return self.tau_start + share * (self.tau_end - self.tau_start)
        return self.calibrated_tau

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx:  # once an epoch, after the module fitted the detached head (its on_train_epoch_start)
            return
        stats = pl_module.risk_fit_stats if isinstance(pl_module, PreparesEpochs) else {}
        for name, value in stats.items():
            pl_module.log(f"risk/{name}", float(value), on_step=False, on_epoch=True, batch_size=1)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        data = trainer.datamodule
        if trainer.sanity_checking or not isinstance(data, MeasuresRiskRule):
            return
        if not isinstance(pl_module, SamplingPolicy) or pl_module.context_risk() is None:
            return  # no risk head: no rule to measure
        records = data.val_records()
        outcomes = {tau: data.rule_outcome(pl_module, records, tau) for tau in self.candidates}
        if self.mode == "calibrated":
            counts = [(t, int(o.errors.sum()), int(o.covered.sum())) for t, o in outcomes.items()]
            self.calibrated_tau, _ = learn_then_test(counts, self.alpha, self.delta)
        tau = self.current_tau(trainer.current_epoch)
        if self.decision == "value":
            current = data.rule_outcome(pl_module, records, None, decision="value", cvar_level=self.cvar_level)
        else:
            current = outcomes.get(tau) or data.rule_outcome(pl_module, records, tau)
        self.log_outcome(pl_module, current)
        self.log_curve(trainer, [outcomes[t] for t in self.candidates])
        shown = ("value rule" if self.decision == "value" else
                 "always defer (no certified tau)" if tau is None else f"{tau:g}")
        rank_zero_info(f"risk: tau {shown}, coverage {current.coverage:.3f}, selective error "
                       f"{fmt(current.selective_error)}, "
                       f"mean return {float(current.returns.mean()):.3f}; curve (tau: coverage, error): " +
                       ", ".join(f"{t:g}: {o.coverage:.2f}, {fmt(o.selective_error)}" for t, o in outcomes.items()))

    def log_outcome(self, pl_module: Any, outcome: RuleOutcome) -> None:
        error = outcome.selective_error
        metrics = {
            "risk/always_defer": float(outcome.tau is None and self.decision == "threshold"),
            "risk/coverage": outcome.coverage,
            "risk/selective_error": float("nan") if error is None else error,
            "risk/mean_return": float(outcome.returns.mean()),
            "risk/ece": expected_calibration_error(outcome.decision_p_error, outcome.decision_error),
        }
        if outcome.tau is not None:
            metrics["risk/tau"] = outcome.tau
        for name, value in metrics.items():
            pl_module.log(name, torch.tensor(value), sync_dist=True)

    def log_curve(self, trainer: pl.Trainer, outcomes: list[RuleOutcome]) -> None:
        logger = trainer.logger
        if logger is None or not hasattr(logger.experiment, "add_figure"):
            return
        logger.experiment.add_figure("risk/risk_coverage", risk_coverage_figure(outcomes), trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"calibrated_tau": self.calibrated_tau}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.calibrated_tau = state_dict["calibrated_tau"]


def fmt(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def risk_coverage_figure(outcomes: list[RuleOutcome]) -> Any:
    """Selective error against coverage, one point per tau (labelled)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(4, 3), dpi=100)
    points = [(o.coverage, o.selective_error, o.tau) for o in outcomes if o.selective_error is not None]
    if points:
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o")
        for coverage, error, tau in points:
            axes.annotate(f"{tau:g}", (coverage, error), fontsize=7)
    axes.set_xlabel("coverage")
    axes.set_ylabel("selective error")
    axes.set_xlim(0, 1)
    axes.set_ylim(bottom=0)
    figure.tight_layout()
    return figure
