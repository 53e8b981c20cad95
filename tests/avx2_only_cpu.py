"""A pytest plugin that makes this process see an AVX2-only x86 CPU (issue 40 item 7), to check that the suite does
not depend on the machine's CPU: ``PYTHONPATH=tests .venv/bin/python -m pytest -p avx2_only_cpu tests/...``.

Where lit_grpo reads the CPU, it answers as the AVX2-only CPU of issue 34 does: ``torch.cpu.get_capabilities()``
reports no AVX-512, AMX or avx_ne_convert, and oneDNN's bf16 weight reorder raises its own message. oneDNN's and
ATen's kernels are held to AVX2 too (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``, read when torch loads: this
plugin is imported before it). Child processes see the real CPU."""

from __future__ import annotations

import os
import sys
from typing import Any

if "torch" in sys.modules:  # its kernels' ISA is read once, when it loads
    raise RuntimeError("avx2_only_cpu must load before torch: pass it to pytest with -p avx2_only_cpu")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

BEYOND_AVX2 = ("avx512", "amx", "avx_ne_convert", "avx_vnni")  # capability names an AVX2-only CPU lacks
REORDER_REFUSAL = ("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, "
                   "avx512vl and avx512dq")


def avx2_only(capabilities: dict[str, Any]) -> dict[str, Any]:
    """``capabilities`` with every flag beyond AVX2 off."""
    return {name: (False if name.startswith(BEYOND_AVX2) else value) for name, value in capabilities.items()}


def pytest_configure(config: Any) -> None:
    import torch
    # inductor builds its decomposition table over torch.ops when it first loads (vllm loads it, and TRL's trainer
    # imports vllm): with a Python function standing in the mkldnn namespace that build fails, so it is built first
    import torch._inductor.lowering  # noqa: F401

    real_capabilities, real_reorder = torch.cpu.get_capabilities, torch.ops.mkldnn._reorder_linear_weight

    def reorder(weight: torch.Tensor, *args: Any) -> torch.Tensor:
        if weight.dtype == torch.bfloat16:
            raise RuntimeError(REORDER_REFUSAL)
        return real_reorder(weight, *args)

    torch.cpu.get_capabilities = lambda: avx2_only(dict(real_capabilities()))
    torch.ops.mkldnn._reorder_linear_weight = reorder
