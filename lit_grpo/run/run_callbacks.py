"""The callbacks every run needs, whoever builds the ``Trainer``: ``PolicyModule.configure_callbacks`` returns them.

Lightning lets a callback returned by ``configure_callbacks`` replace the trainer's callbacks of its type (2.6.6,
``_attach_model_callbacks``): a module returning a default ``NonFiniteGuard`` would throw away the one a user
configured with their own settings. So only the kinds the trainer holds none of (itself or a subclass) are returned.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl

from lit_grpo.run.nonfinite import NonFiniteGuard
from lit_grpo.run.rng_state import RngState
from lit_grpo.run.signals import StopOnSigterm

# a non-finite step skipped, never applied; an exact resume's RNG states; SIGTERM stopping the run wherever it stands
EVERY_RUN = (NonFiniteGuard, RngState, StopOnSigterm)


def missing_run_callbacks(present: Iterable[Any], kinds: Iterable[type[pl.Callback]] = EVERY_RUN) -> list[pl.Callback]:
    """A default instance of each of ``kinds`` that ``present`` (the trainer's callbacks) has no instance of."""
    present = list(present)
    return [kind() for kind in kinds if not any(isinstance(callback, kind) for callback in present)]
