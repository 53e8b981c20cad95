"""Callbacks around the training loop, installed as ``lit_grpo.callbacks``."""

from lit_grpo.callbacks.metrics import RolloutMetrics
from lit_grpo.callbacks.reference import ReferencePolicy

__all__ = ["ReferencePolicy", "RolloutMetrics"]
