"""Checks of the run's inputs that need the loaded tokenizer or model, made before any rollout is generated.

Each failure raises ``InputError`` with a message that names the input and what to change; the ``lit-grpo``
command prints it without a traceback (exit code 2), like the up-front config check.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def adaptable_module_names(model: Any) -> list[str]:
    """Sorted last names of the modules LoRA can adapt (linear and GPT-2's Conv1D layers), e.g. ``q_proj``."""
    from torch import nn

    names = set()
    for full_name, module in model.named_modules():
        if full_name and (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            names.add(full_name.rsplit(".", 1)[-1])
    return sorted(names)


def lora_target_problem(model: Any, targets: str | Sequence[str]) -> str | None:
    """Why ``lora.target_modules`` does not fit ``model``: the names it lacks, and the names it has."""
    if targets == "all-linear":
        return None
    module_names = [name for name, _ in model.named_modules() if name]
    if isinstance(targets, str):  # PEFT reads a string as a regex over full module names
        if any(re.fullmatch(targets, name) for name in module_names):
            return None
        missing = [targets]
    else:
        missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in module_names)]
    if not missing:
        return None
    return (
        f"lora.target_modules: the model has no module named {', '.join(map(repr, missing))}; "
        f"its adaptable modules are: {', '.join(adaptable_module_names(model))} (or use 'all-linear')"
    )
