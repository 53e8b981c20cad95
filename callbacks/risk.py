"""RiskThreshold: owns the infer/defer threshold tau of the risk rule, calibrates it, and logs risk-coverage."""

from __future__ import annotations

from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.risk import calibrate_tau, expected_calibration_error
from lit_grpo.risk_rollout import rule_outcome

DEFAULT_CANDIDATES = [0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0]


class RiskThreshold(pl.Callback):
    """The threshold tau of the risk rule (infer only if the risk head's P(error) <= tau, else defer), applied to
    training rollouts and to validation, and checkpointed.

    Args:
        mode: ``fixed`` (always ``tau``), ``scheduled`` (linear from ``tau_start`` at epoch 0 to ``tau`` at epoch
            ``schedule_epochs``, then ``tau``) or ``calibrated`` (``tau_start`` until the first validation; then,
            at every validation, the largest of ``candidates`` whose selective error on fresh greedy episodes of
            the held-out prompts is <= ``alpha``; if none is, the explicit always-defer state, logged as
            ``risk/always_defer`` 1, in which validation defers everywhere while training rollouts grow free).
        tau: the fixed threshold, or the end of the schedule.
        tau_start: the threshold before the head has learned anything (1.0 lets the policy infer freely, so the
            head sees outcomes of inferring to learn from).
        schedule_epochs: epochs over which ``scheduled`` moves from ``tau_start`` to ``tau``.
        alpha: the target selective error (errors among inferred answers) of ``calibrated``.
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
        candidates: list[float] = DEFAULT_CANDIDATES,  # noqa: B006 - shown by --help; never mutated
        explore_fraction: float = 0.25,
    ) -> None:
        problems = []
        if mode not in ("fixed", "scheduled", "calibrated"):
            problems.append(f"mode: unknown value {mode!r}; valid choices: fixed, scheduled, calibrated")
        for name, value in (("tau", tau), ("tau_start", tau_start), ("alpha", alpha),
                            ("explore_fraction", explore_fraction)):
            if not 0 <= value <= 1:
                problems.append(f"{name}: must be in [0, 1], got {value}")
        if schedule_epochs < 1:
            problems.append(f"schedule_epochs: must be >= 1, got {schedule_epochs}")
        if not candidates or any(not 0 <= c <= 1 for c in candidates):
            problems.append(f"candidates: need at least one value, each in [0, 1], got {candidates}")
        if problems:
            raise ValueError("invalid RiskThreshold configuration:\n  - " + "\n  - ".join(problems))
        self.mode, self.tau_end, self.tau_start = mode, tau, tau_start
        self.schedule_epochs, self.alpha, self.candidates = schedule_epochs, alpha, sorted(candidates)
        self.explore_fraction = explore_fraction
        self.calibrated_tau: float | None = tau_start

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        if trainer.datamodule is not None:
            trainer.datamodule.risk_threshold = self  # the rollouts' infer/defer rule reads its tau from here

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

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking or pl_module.risk_head is None:
            return
        datamodule = trainer.datamodule
        records = datamodule.val_records()
        outcomes = {tau: rule_outcome(pl_module, datamodule, records, tau) for tau in self.candidates}
        if self.mode == "calibrated":
            chosen, _ = calibrate_tau(self.candidates, lambda t: (outcomes[t].selective_error, outcomes[t].coverage),
                                      self.alpha)
            self.calibrated_tau = chosen
        tau = self.current_tau(trainer.current_epoch)
        current = outcomes.get(tau) or rule_outcome(pl_module, datamodule, records, tau)
        self.log_outcome(pl_module, current)
        self.log_curve(trainer, [outcomes[t] for t in self.candidates])
        shown = "always defer (no feasible tau)" if tau is None else f"{tau:g}"
        rank_zero_info(f"risk: tau {shown}, coverage {current.coverage:.3f}, selective error "
                       f"{fmt(current.selective_error)}, "
                       f"mean return {float(current.returns.mean()):.3f}; curve (tau: coverage, error): " +
                       ", ".join(f"{t:g}: {o.coverage:.2f}, {fmt(o.selective_error)}" for t, o in outcomes.items()))

    def log_outcome(self, pl_module: Any, outcome: Any) -> None:
        error = outcome.selective_error
        metrics = {
            "risk/always_defer": float(outcome.tau is None),
            "risk/coverage": outcome.coverage,
            "risk/selective_error": float("nan") if error is None else error,
            "risk/mean_return": float(outcome.returns.mean()),
            "risk/ece": expected_calibration_error(outcome.decision_p_error, outcome.decision_error),
        }
        if outcome.tau is not None:
            metrics["risk/tau"] = outcome.tau
        for name, value in metrics.items():
            pl_module.log(name, torch.tensor(value), sync_dist=True)

    def log_curve(self, trainer: pl.Trainer, outcomes: list[Any]) -> None:
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


def risk_coverage_figure(outcomes: list[Any]) -> Any:
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
