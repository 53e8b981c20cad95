"""lit-grpo: GRPO and tree-relative policy optimisation of LoRA policies on PyTorch Lightning.

``PolicyModule`` (the policy and its loss) and ``RolloutDataModule`` (prompts, rollouts, rewards) run under any
``lightning.Trainer`` as under the ``lit-grpo`` command (README, "From Python"). They are imported on first use, so
that ``import lit_grpo`` (the command's start, ``lit_grpo.errors``) does not load torch, Lightning and transformers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule

__version__ = "0.1.0"
__all__ = ["PolicyModule", "RolloutDataModule", "__version__"]

_EXPORTS = {"PolicyModule": "lit_grpo.policy.module", "RolloutDataModule": "lit_grpo.rollout.datamodule"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lit_grpo' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
