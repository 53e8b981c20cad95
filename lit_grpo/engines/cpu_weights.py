"""Frozen linear weights in oneDNN's packed layout while the hf engine decodes on a CPU, where the CPU can.

A decode step multiplies a few rows by every weight matrix, the output head included (``[rows, hidden] x [hidden,
vocab]``). On this machine's CPU (AVX-512 with avx512_bf16), PyTorch's plain ``linear`` does that for 4 rows by
Qwen2.5-0.5B's head in 18 ms in bf16 and 86 ms in fp32; the same product on a weight reordered once by oneDNN (the
prepacking ``torch.compile`` uses for CPU inference) takes 10 and 19 ms (``benchmarks/speed/generation.py``). bf16
results are bit-identical; fp32 ones differ in accumulation order, by ~2e-6 on the head's logits.

Not every CPU packs every dtype. oneDNN packs bf16 only on an x86 CPU with avx512bw, avx512vl and avx512dq, or with
avx_ne_convert (elsewhere ``_reorder_linear_weight`` raises "bf16 path needs the cpu support avx_ne_convert or
avx512bw, avx512vl and avx512dq"). Such a dtype is decoded unpacked, with one message per process naming it and why
(``packing_refusal``); the other dtypes still pack. Each dtype is also tried once on a tiny weight before its first
use (any CPU, any build), and a reorder that fails while generating marks its dtype unpacked instead of failing the
rollout. Measured on a CPU without AVX-512 (issue 34, the same head): fp32 plain 644 ms, fp32 packed 193 ms, bf16
plain 300 ms, so there ``model.dtype: auto`` loads a bf16 checkpoint in fp32 where it fits
(``lit_grpo.run.dtype_choice``).

Only frozen weights are packed (the base model's, never LoRA's), only for the length of one ``generate`` call, and
the packed copies are freed when it ends: while decoding, the frozen linear weights are held twice.

The environment variable ``LIT_GRPO_CPU_NO_BF16_PACKING=1`` makes this process behave as on a CPU that cannot pack
bf16 (the tests force that path with it on a CPU that can; a user may set it too), and without bf16 arithmetic, for
``model.dtype: auto``'s choice.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.run.dtype_choice import NO_BF16_PACKING

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
BF16_PACKING_NEEDS = "avx512bw, avx512vl and avx512dq, or avx_ne_convert"

_refused_while_generating: dict[torch.dtype, str] = {}  # dtypes whose reorder failed inside a generate call
_told: set[torch.dtype] = set()  # dtypes whose unpacked decoding has been reported in this process


def packing_available() -> bool:
    """Whether this torch build has oneDNN and its linear prepacking ops."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return callable(torch.ops.mkldnn._reorder_linear_weight) and callable(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


def cpu_capabilities() -> dict[str, Any]:
    """What torch's cpuinfo reports about this CPU (``torch.cpu.get_capabilities()``: ``avx512_bw``,
    ``avx_ne_convert``, ``avx512_bf16``, ``amx_bf16``, ...); empty where this build cannot say."""
    try:
        return dict(torch.cpu.get_capabilities())
    except (AttributeError, RuntimeError):
        return {}


def on_x86() -> bool:
    return platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}


def bf16_packing_supported(capabilities: dict[str, Any]) -> bool:
    """oneDNN's own condition for bf16 linear prepacking on x86 (``mkldnn_bf16_device_check``)."""
    avx512 = all(capabilities.get(flag, False) for flag in ("avx512_bw", "avx512_vl", "avx512_dq"))
    return avx512 or bool(capabilities.get("avx_ne_convert", False))


def packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x [..., in] @ W.T + b`` with ``W`` prepacked by oneDNN: ``[..., out]``."""
    flat = x.reshape(-1, x.shape[-1])  # [rows, in]
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")  # [rows, out]
    return out.reshape(*x.shape[:-1], out.shape[-1])


@functools.cache
def trial_refusal(dtype: torch.dtype) -> str | None:
    """Pack a ``[8, 16]`` weight of ``dtype`` and multiply by it, once per process: ``None`` when the product is the
    plain one, else what went wrong (oneDNN's first line when it raises)."""
    weight = torch.linspace(-1, 1, 128).reshape(8, 16).to(dtype)  # [out 8, in 16]
    x = torch.linspace(1, -1, 32).reshape(2, 16).to(dtype)  # [rows 2, in 16]
    try:
        out = packed_linear(torch.ops.mkldnn._reorder_linear_weight(weight, None), None, x)  # [2, 8]
    except RuntimeError as error:
        return f"oneDNN cannot pack {dtype_name(dtype)} weights here ({first_line(error)})"
    if out.shape != (2, 8) or not torch.allclose(out.float(), (x.float() @ weight.float().T), atol=0.1):
        return f"oneDNN's packed {dtype_name(dtype)} product disagrees with the plain one here"
    return None


def packing_refusal(dtype: torch.dtype) -> str | None:
    """Why linear weights of ``dtype`` (one of ``PACKABLE_DTYPES``) are not packed in this process, or ``None``
    when they are: no prepacking in this build, ``LIT_GRPO_CPU_NO_BF16_PACKING`` set, a CPU without oneDNN's bf16
    instructions, a reorder that failed earlier while generating, or the one-time trial failing."""
    if not packing_available():
        return "this torch build has no oneDNN linear prepacking"
    if dtype == torch.bfloat16:
        if os.environ.get(NO_BF16_PACKING, "") not in ("", "0"):
            return f"{NO_BF16_PACKING} is set (as on a CPU without {BF16_PACKING_NEEDS})"
        if on_x86() and not bf16_packing_supported(cpu_capabilities()):
            return f"this CPU has no bf16 packing support (needs {BF16_PACKING_NEEDS})"
    return _refused_while_generating.get(dtype) or trial_refusal(dtype)


def packable_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes whose linear weights are packed in this process."""
    return tuple(dtype for dtype in PACKABLE_DTYPES if packing_refusal(dtype) is None)


def packs(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is packed; the first time it is not, say so (once per process and dtype)."""
    reason = packing_refusal(dtype)
    if reason is not None and dtype not in _told:
        _told.add(dtype)
        faster = ("; model.dtype float32 is packed here and decodes faster"
                  if dtype == torch.bfloat16 and packing_refusal(torch.float32) is None else "")
        rank_zero_info(f"hf engine: {reason}; decoding {dtype_name(dtype)} weights unpacked{faster}")
    return reason is None


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
    """Inside the block, every packable linear of ``model`` whose dtype this CPU packs computes with a packed copy
    of its weight (gradients are not needed: use under ``torch.no_grad``). Yields how many were packed; nothing is
    packed off the CPU, when ``enabled`` is false or when the build lacks the ops. A dtype the CPU cannot pack is
    left plain (``packs`` says so once), and so is one whose reorder fails here (it is not tried again)."""
    candidates = [m for m in model.modules() if packable(m)] if enabled and packing_available() else []
    verdicts = {dtype: packs(dtype) for dtype in {m.weight.dtype for m in candidates}}
    modules: list[torch.nn.Module] = []
    try:
        for module in candidates:
            dtype = module.weight.dtype
            if not verdicts[dtype]:
                continue
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
            except RuntimeError as error:
                why = f"oneDNN failed to pack a {dtype_name(dtype)} weight ({first_line(error)})"
                _refused_while_generating[dtype] = why
                verdicts[dtype] = packs(dtype)  # False, and said once
                continue
            bias = None if module.bias is None else module.bias.detach()
            module.forward = functools.partial(packed_linear, packed, bias)  # shadows the class's forward
            modules.append(module)
        yield len(modules)
    finally:
        for module in modules:
            module.__dict__.pop("forward", None)  # back to nn.Linear.forward; the packed copy is freed


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
