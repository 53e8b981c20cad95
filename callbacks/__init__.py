"""Callbacks around the training loop, installed as ``lit_grpo.callbacks``.

``NonFiniteGuard`` and ``RngState`` live in ``lit_grpo.run`` (every run needs them: ``PolicyModule`` declares them in
``configure_callbacks``); they are re-exported here so that configs naming ``lit_grpo.callbacks.NonFiniteGuard`` or
``lit_grpo.callbacks.RngState`` keep working.
"""

from lit_grpo.callbacks.metrics import RolloutMetrics
from lit_grpo.callbacks.reference import ReferencePolicy
from lit_grpo.callbacks.risk import RiskThreshold
from lit_grpo.run.nonfinite import NonFiniteGuard
from lit_grpo.run.rng_state import RngState

__all__ = ["NonFiniteGuard", "ReferencePolicy", "RiskThreshold", "RngState", "RolloutMetrics"]
