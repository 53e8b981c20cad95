"""Callbacks around the training loop, installed as ``lit_grpo.callbacks``."""

from lit_grpo.callbacks.metrics import RolloutMetrics
from lit_grpo.callbacks.nonfinite import NonFiniteGuard
from lit_grpo.callbacks.reference import ReferencePolicy
from lit_grpo.callbacks.risk import RiskThreshold
from lit_grpo.callbacks.rng_state import RngState

__all__ = ["NonFiniteGuard", "ReferencePolicy", "RiskThreshold", "RngState", "RolloutMetrics"]
