"""Callbacks around the training loop, installed as ``lit_grpo.callbacks``."""

from lit_grpo.callbacks.metrics import RolloutMetrics
from lit_grpo.callbacks.reference import ReferencePolicy
from lit_grpo.callbacks.risk import RiskThreshold

__all__ = ["ReferencePolicy", "RiskThreshold", "RolloutMetrics"]
