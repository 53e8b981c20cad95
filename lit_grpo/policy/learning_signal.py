"""A run that cannot learn says so. A group whose rewards are all equal gives every completion advantage 0 in the
group-relative modes (``flat_means_no_signal``): no policy gradient. When every group of several epochs in a row is so, the run trains on nothing;
``no_signal_verdict`` names the cause (a reward failing on every completion, completions all alike, rewards all
alike) in one warning, and stops the run where nothing can change it: sampling so cold that each prompt's
completions are one completion drawn ``group_size`` times, which no update can change because no update happens.

The figures are read from the rollout side's published ``RolloutReport`` (``ReportsRollouts``), summed over ranks so
that every rank decides alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.protocols import ReportsRollouts
from lit_grpo.buffers.report import RolloutReport
from lit_grpo.errors import InputError
from lit_grpo.policy.knob_groups import group

PATIENCE = 3  # epochs in a row without a learning signal before the run says so
# the advantage modes that give a group whose rewards are all equal advantage 0 (``raw`` gives r; ``gae`` a value
# baseline's residual)
GROUP_RELATIVE = ("centered", "grpo", "drgrpo", "rloo", "max")
# at or below this temperature sampling is the argmax: a logit gap of 0.5 makes the runner-up e^-50 times as likely
COLD_TEMPERATURE = 1e-2


@dataclass(frozen=True)
class EpochSignal:
    """What one epoch's rollouts give the policy to learn from (over every rank)."""

    groups: int
    flat_groups: int  # groups whose rewards are all equal: advantage 0 for each of their completions
    identical_groups: int  # groups whose completions are the same tokens (grouped rollouts; 0 for trees)
    completions: int
    failed_completions: int  # completions whose reward failed (rollout/reward_errors)


@dataclass(frozen=True)
class Verdict:
    stop: bool  # nothing can change it: stop the run (else: one warning)
    cause: str  # which of the causes, so that each is said once
    message: str


def flat_means_no_signal(advantage_mode: str | None, kl_applied_to: str | None, kl_coef: float | None) -> bool:
    """Whether a group with equal task rewards gives no policy gradient: a group-relative advantage mode, its
    rewards not changed by a KL penalty (``kl.applied_to: reward`` with ``kl.coef`` > 0 subtracts each sequence's own
    KL)."""
    return advantage_mode in GROUP_RELATIVE and not (kl_applied_to == "reward" and (kl_coef or 0) > 0)


def epoch_signal(buffer: RolloutBuffer) -> EpochSignal:
    """``EpochSignal`` of one rank's buffer (``rewards`` ``[N]``, rows grouped by ``buffer.sizes``)."""
    sizes = buffer.sizes
    groups = buffer.rewards.split(sizes)
    flat = sum(bool(g.amax() == g.amin()) for g in groups)
    identical = 0
    if buffer.trees is None:
        start = 0
        for size in sizes:
            rows = [tuple(buffer.input_ids[r][buffer.completion_mask[r]].tolist()) for r in range(start, start + size)]
            identical += len(set(rows)) == 1
            start += size
    return EpochSignal(len(sizes), flat, identical, int(buffer.rewards.numel()), int(buffer.reward_errors))


def no_signal_verdict(epochs: Sequence[EpochSignal], temperature: float,
                      patience: int = PATIENCE) -> Verdict | None:
    """Whether the last ``patience`` of ``epochs`` (oldest first) gave nothing to learn from (every group flat in each),
    why, and whether to stop; None when some group had a spread, or fewer than ``patience`` epochs were seen.

    Causes, first match: every group's completions identical at ``temperature <= COLD_TEMPERATURE`` (stop);
    every completion's reward failed (warn); every group's completions identical at a warmer temperature (warn);
    rewards equal within every group (warn).
    """
    window = list(epochs)[-patience:]
    if len(window) < patience or any(e.flat_groups < e.groups or e.groups == 0 for e in window):
        return None
    span = f"for {patience} epochs in a row"
    identical = all(e.identical_groups == e.groups for e in window)
    if identical and temperature <= COLD_TEMPERATURE:
        return Verdict(True, "cold", (
            f"every group's completions were one completion repeated {span} at data.temperature {temperature:g}: "
            "sampling this cold draws the most likely completion every time, so no group has a reward spread, no "
            "update happens and none can change it; raise data.temperature (1.0 samples the policy as it is)"))
    if all(e.failed_completions == e.completions for e in window):
        return Verdict(False, "reward-failed", (
            f"the reward failed on every completion {span} (rollout/reward_errors; the reward-error warnings name "
            "what it raised): every completion scores the task's failure_reward, so the run trains on nothing; fix "
            "the reward"))
    if identical:
        return Verdict(False, "identical", (
            f"every group's completions were one completion repeated {span} (data.temperature {temperature:g}): the "
            "policy is too sure of its answers for its groups to differ, so the run trains on nothing; raise "
            "data.temperature or data.group_size"))
    return Verdict(False, "flat", (
        f"every group's rewards were equal {span} (rollout/zero_std_frac 1.0): no completion did better than its "
        "group, so the run trains on nothing; the task may be too hard or too easy for the model, or the reward "
        "gives one value to all"))


class LearningSignalWatch(pl.Callback):
    """At each epoch's start, once its rollouts are drawn and before training on them: ``no_signal_verdict`` over the
    epochs so far; a warning once per cause, or a stop (``InputError``, one message) where nothing can change it.
    Only for a module whose hyper-parameters (Lightning's ``hparams``) make a flat group signal-free
    (``flat_means_no_signal``)."""

    def __init__(self, patience: int = PATIENCE) -> None:
        self.patience = patience
        self.epochs: list[EpochSignal] = []
        self.warned: set[str] = set()
        self._seen: RolloutReport | None = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = trainer.datamodule
        report = datamodule.epoch_report if isinstance(datamodule, ReportsRollouts) else None
        knobs = pl_module.hparams
        kl = group(knobs, "kl")
        if not flat_means_no_signal(knobs.get("advantage_mode"), kl.applied_to, kl.coef):
            return
        if report is None or report is self._seen:  # no rollouts this epoch (a resume's placeholder loader)
            return
        self._seen = report
        signal = epoch_signal(report.buffer)
        if trainer.world_size > 1:  # every rank decides on the same sums, so all stop or none
            figures = torch.tensor([signal.groups, signal.flat_groups, signal.identical_groups, signal.completions,
                                    signal.failed_completions], device=trainer.strategy.root_device)
            signal = EpochSignal(*(int(v) for v in trainer.strategy.reduce(figures, reduce_op="sum").tolist()))
        self.epochs = [*self.epochs[-(self.patience - 1):], signal] if self.patience > 1 else [signal]
        verdict = no_signal_verdict(self.epochs, report.buffer.temperature, self.patience)
        if verdict is None:
            return
        if verdict.stop:
            raise InputError(verdict.message)
        if verdict.cause not in self.warned:
            self.warned.add(verdict.cause)
            rank_zero_warn(verdict.message)
