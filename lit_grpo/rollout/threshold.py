"""The infer/defer rule as the data module applies it: the ``RiskThresholdSource`` a callback gave
(``RolloutDataModule.use_risk_threshold``), the rule at its tau for an epoch's training rollouts or for validation,
and the share of training prompts grown without it."""

from __future__ import annotations

from lit_grpo.buffers.protocols import RiskThresholdSource, SamplingPolicy
from lit_grpo.errors import refuse
from lit_grpo.risk.rule import RiskRule
from lit_grpo.run.rules import risk_decision_problems
from lit_grpo.tasks import Task
from lit_grpo.tasks.episodes import MultiRoundTask, names_answer_tokens


class ThresholdedRule:
    """Owns the threshold source the rollouts' rule reads (None: no rule) for one task."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.source: RiskThresholdSource | None = None

    def use(self, source: RiskThresholdSource | None) -> None:
        """Apply the rule at ``source``'s tau; a source whose way of deciding the task cannot take is refused."""
        if source is not None:
            refuse("the callbacks and the task do not fit together",
                   risk_decision_problems(source.decision, type(self.task).__name__, names_answer_tokens(self.task)))
        self.source = source

    def at(self, module: SamplingPolicy, epoch: int, training: bool) -> RiskRule | None:
        """The rule at the source's tau for ``epoch``'s training rollouts (``training_tau``) or its validation
        (``current_tau``); None without a risk head or a source."""
        risk, source = module.context_risk(), self.source
        if risk is None or source is None or not isinstance(self.task, MultiRoundTask):
            return None
        tau = source.training_tau(epoch) if training else source.current_tau(epoch)
        return RiskRule.for_task(risk, tau, self.task, module.tokenizer, source.decision, source.cvar_level)

    def explore_fraction(self, rule: RiskRule | None) -> float:
        """The share of training prompts whose trees grow without ``rule`` (0 without one)."""
        return 0.0 if rule is None or self.source is None else self.source.explore_fraction
