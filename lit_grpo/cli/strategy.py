"""A training strategy that cannot run on the chosen accelerator, reported as one config problem before any work.

Lightning refuses FSDP off CUDA with a ``ValueError`` raised from deep inside ``Trainer.__init__`` (a traceback at
the user), and DeepSpeed fails later still. Both shard what lit-grpo barely has to shard: the trained LoRA adapter
is megabytes and the frozen base is replicated on every rank, so DDP is the strategy for any base that fits one
device (FSDP is for a base that does not fit one device in bf16). See docs/scaling.md.
"""

from __future__ import annotations

import importlib.util
import pkgutil
from typing import Any

GPU_ACCELERATORS = ("gpu", "cuda")  # the accelerator names Lightning accepts for FSDP and DeepSpeed


def strategy_problems(trainer_cfg: dict[str, Any]) -> list[str]:
    """One problem when ``trainer.strategy`` is FSDP or DeepSpeed and ``trainer.accelerator`` is not a GPU (or the
    deepspeed package is missing); none for every other strategy, including ones this check cannot resolve (their
    own errors speak at instantiation)."""
    family = sharded_family(trainer_cfg.get("strategy"))
    if family is None:
        return []
    strategy = strategy_label(trainer_cfg.get("strategy"))
    accelerator, on_gpu = resolved_accelerator(trainer_cfg.get("accelerator"))
    if not on_gpu:
        return [f"trainer.strategy {strategy} with trainer.accelerator {accelerator}: {family} needs GPUs "
                "(Lightning runs it on CUDA devices only); on CPU use --trainer.strategy ddp (with "
                "--trainer.accelerator cpu, gloo), or run on GPUs with --trainer.accelerator gpu"]
    if family == "DeepSpeed" and importlib.util.find_spec("deepspeed") is None:
        return [f"trainer.strategy {strategy}: the deepspeed package is not installed (pip install deepspeed), "
                "or use --trainer.strategy ddp"]
    return []


def sharded_family(spec: Any) -> str | None:
    """``"FSDP"`` or ``"DeepSpeed"`` when ``spec`` (a registered name such as ``fsdp`` or ``deepspeed_stage_2``, a
    class path, or ``{class_path: ...}``) names one of their strategies; else None."""
    from lightning.pytorch.strategies import (
        DeepSpeedStrategy,
        FSDPStrategy,
        StrategyRegistry,
    )

    cls = None
    if isinstance(spec, dict):
        spec = spec.get("class_path")
    if isinstance(spec, str) and spec.lower() in StrategyRegistry:
        cls = StrategyRegistry[spec.lower()]["strategy"]
    elif isinstance(spec, str) and "." in spec:
        cls = imported(spec)
    if not isinstance(cls, type):
        return None
    if issubclass(cls, FSDPStrategy):
        return "FSDP"
    if issubclass(cls, DeepSpeedStrategy):
        return "DeepSpeed"
    return None


def resolved_accelerator(spec: Any) -> tuple[str, bool]:
    """``(how to name it in a message, whether it is a CUDA GPU)``. ``auto`` (or unset) is resolved as Lightning
    does: CUDA when torch sees a GPU, else (on this check's side) not a GPU."""
    import torch
    from lightning.pytorch.accelerators import CUDAAccelerator

    if isinstance(spec, dict):
        spec = spec.get("class_path")
    if spec is None or (isinstance(spec, str) and spec.lower() == "auto"):
        on_gpu = torch.cuda.is_available()
        return f"auto (which is {'cuda' if on_gpu else 'cpu'} on this machine)", on_gpu
    if isinstance(spec, str) and "." in spec:
        cls = imported(spec)
        return spec, isinstance(cls, type) and issubclass(cls, CUDAAccelerator)
    return str(spec), str(spec).lower() in GPU_ACCELERATORS


def strategy_label(spec: Any) -> str:
    return str(spec.get("class_path") if isinstance(spec, dict) else spec)


def imported(path: str) -> Any:
    """The object at a dotted path, or None when it does not import (reported elsewhere)."""
    try:  # as config_check.import_object does (run/ does not import the top level): a dotted path only
        return pkgutil.resolve_name(path) if "." in path else None
    except Exception:  # noqa: BLE001 - any import failure means "cannot tell"
        return None
