"""Frozen linear weights in oneDNN's packed layout while the hf engine decodes on a CPU.

A decode step multiplies a few rows by every weight matrix, the output head included (``[rows, hidden] x [hidden,
vocab]``). On this machine's CPU, PyTorch's plain ``linear`` does that for 4 rows by Qwen2.5-0.5B's head in 18 ms in
bf16 and 86 ms in fp32; the same product on a weight reordered once by oneDNN (the prepacking ``torch.compile``
uses for CPU inference) takes 10 and 19 ms (``benchmarks/generation.py``). bf16 results are bit-identical; fp32 ones
differ in accumulation order, by ~2e-6 on the head's logits.

Only frozen weights are packed (the base model's, never LoRA's), only for the length of one ``generate`` call, and
the packed copies are freed when it ends: while decoding, the frozen linear weights are held twice.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packing_available() -> bool:
    """Whether this torch build has oneDNN and its linear prepacking ops."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._reorder_linear_weight) and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x [..., in] @ W.T + b`` with ``W`` prepacked by oneDNN: ``[..., out]``."""
    flat = x.reshape(-1, x.shape[-1])  # [rows, in]
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")  # [rows, out]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def packable(module: torch.nn.Module) -> bool:
    """A plain ``nn.Linear`` whose weight is frozen, on the CPU, in a dtype oneDNN packs."""
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear
        and weight is not None
        and not weight.requires_grad
        and weight.device.type == "cpu"
        and weight.dtype in PACKABLE_DTYPES
    )


@contextmanager
def packed_frozen_linears(model: Any, enabled: bool = True) -> Iterator[int]:
    """Inside the block, every packable linear of ``model`` computes with a packed copy of its weight (gradients are
    not needed: use under ``torch.no_grad``). Yields how many were packed; nothing is packed off the CPU, when
    ``enabled`` is false or when the build lacks the ops."""
    modules = [m for m in model.modules() if packable(m)] if enabled and packing_available() else []
    try:
        for module in modules:
            packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
            bias = None if module.bias is None else module.bias.detach()
            module.forward = functools.partial(packed_linear, packed, bias)  # shadows the class's forward
        yield len(modules)
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)  # back to nn.Linear.forward; the packed copy is freed
