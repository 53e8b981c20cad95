"""What ``model.dtype: auto`` loads the policy's frozen base in: one decision per run, which every copy of the weights
follows (the trainer's; the reference policy's, the same weights with the adapter off; the hf engine's packed copy
while it decodes; a vLLM engine's, whose ``dtype: auto`` is the pushed policy's).

On a GPU: the checkpoint's own dtype. On a CPU, a half-precision checkpoint (bf16, fp16) is trained in it only where
the CPU computes in it (bf16: avx512_bf16, amx_bf16 or avx_ne_convert; fp16: avx512_fp16 or amx_fp16). Elsewhere
PyTorch's half-precision matmuls, the backward's above all, run on slow fallback kernels: on an AVX2 CPU one GRPO
step of 4 x 512 tokens at Qwen2.5-0.5B width did not finish in 900 s from a bf16 base, and took ~245 s from an fp32
one (issue 42). There auto takes float32 when it fits comfortably, which is decided as

    WEIGHT_COPIES x float32 weight bytes <= FLOAT32_SHARE x available memory

``WEIGHT_COPIES`` = 2: the trainer's weights and one engine's copy of them (the hf engine packs every frozen linear
weight for the length of a generate call; a vLLM engine in this process or started by it loads its own). The other
half of the available memory (``FLOAT32_SHARE`` = 1/2) is for what grows with the batch and not with the weights,
and for the rest of a shared node. At Qwen2.5-0.5B (24 layers, 494 M parameters: 1.98 GB in float32) and 8 x 1,024
tokens that is about as much again as the weights: one fp32 logits chunk and its gradient (2 x 256 x 151,936 x
4 B = 0.31 GB), LoRA r 16 with gradients and AdamW state (16 B x 8.8 M = 0.14 GB), one fp32 activation
checkpoint per layer (8,192 x 24 x 896 x 4 B = 0.70 GB), one recomputed layer and the process itself; the measured
peak of that step with an fp32 base is 4.37 GiB (docs/benchmarks.md), so it wants 7.9 GB available. Where float32
does not fit so, auto keeps the checkpoint's half precision and says float32 would be faster.

``choose_auto_dtype`` is the rule (a pure function of what it is told); the readers below it tell it about this
machine. ``LIT_GRPO_CPU_NO_BF16_PACKING=1`` (``lit_grpo.engines.cpu_weights``) makes this process read the CPU as
one without AVX-512, hence without bf16 arithmetic (avx512_bf16 and amx_bf16 come with AVX-512, and avx_ne_convert
would let oneDNN pack bf16).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lit_grpo.run.model_files import BASE_DTYPES, checkpoint_dtype

WEIGHT_COPIES = 2  # the trainer's weights and one engine's copy (hf engine's packed weights, or vLLM's)
FLOAT32_SHARE = 0.5  # of the available memory; the other half is for the batch and the rest of the node
HALF_ARITHMETIC = {  # x86 instructions that compute natively on each half-precision dtype (torch's cpuinfo names)
    "bfloat16": ("avx512_bf16", "amx_bf16", "avx_ne_convert"),
    "float16": ("avx512_fp16", "amx_fp16"),
}
NO_BF16_PACKING = "LIT_GRPO_CPU_NO_BF16_PACKING"  # the engines' override: read the CPU as one without AVX-512
GB = 1e9


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype ``auto`` loads the base in, and the one line saying why."""

    dtype: torch.dtype
    line: str


def float32_fits(float32_bytes: int, available_bytes: int) -> bool:
    """``WEIGHT_COPIES`` float32 copies of the weights within ``FLOAT32_SHARE`` of the available memory.

    >>> float32_fits(664_000_000, 2_656_000_000), float32_fits(664_000_001, 2_656_000_000)
    (True, False)
    """
    return WEIGHT_COPIES * float32_bytes <= FLOAT32_SHARE * available_bytes


def choose_auto_dtype(named: Any, device_type: str, arithmetic: tuple[str, ...] | None, float32_bytes: int | None,
                      available_bytes: int | None) -> DtypeChoice:
    """The base dtype for ``model.dtype: auto``.

    Args:
        named: the dtype the checkpoint's config names, as written (``checkpoint_dtype``), or None.
        device_type: where the model computes (``cpu``, ``cuda``, ...).
        arithmetic: the CPU's instructions that compute on ``named`` natively (``HALF_ARITHMETIC``); empty: none;
            None: this CPU cannot be read (not x86).
        float32_bytes: the weights' size in float32 (None: unknown).
        available_bytes: memory available to this process (None: unknown).
    """
    prefix = "model.dtype auto: "
    if named is None:
        return DtypeChoice(torch.float32, f"{prefix}the checkpoint's config names no dtype; loading it in float32")
    if named not in BASE_DTYPES:
        return DtypeChoice(torch.float32, f"{prefix}the checkpoint is {named}, not a dtype the base is loaded in "
                                          f"({', '.join(BASE_DTYPES)}); loading it in float32")
    own = getattr(torch, named)
    head = f"{prefix}the checkpoint is {named}; loading it in"
    if named == "float32":
        return DtypeChoice(own, f"{head} float32")
    if device_type != "cpu":
        return DtypeChoice(own, f"{head} {named} (the checkpoint's own, on {device_type})")
    short = "bf16" if named == "bfloat16" else "fp16"
    if arithmetic is None:
        return DtypeChoice(own, f"{head} {named} (the checkpoint's own; whether this CPU computes in {short} cannot be "
                                "read here: set model.dtype float32 if steps are slow)")
    if arithmetic:
        return DtypeChoice(own, f"{head} {named}: this CPU computes in {short} ({', '.join(arithmetic)})")
    lacks = f"this CPU has no {short} arithmetic (none of {', '.join(HALF_ARITHMETIC[named])})"
    if float32_bytes is None or available_bytes is None:
        return DtypeChoice(own, f"{head} {named}: {lacks}, where float32 trains several times faster, but the size of "
                                "the float32 weights or the memory available cannot be read here; set model.dtype "
                                "float32 to choose it")
    sizes = (f"{WEIGHT_COPIES} copies of {float32_bytes / GB:.2f} GB of float32 weights "
             f"{{}} {FLOAT32_SHARE:.0%} of the {available_bytes / GB:.2f} GB available")
    if float32_fits(float32_bytes, available_bytes):
        return DtypeChoice(torch.float32, f"{head} float32: {lacks}, where {short} training is several times slower, "
                                          f"and float32 fits ({sizes.format('within')}); set model.dtype {named} for "
                                          "half the memory")
    return DtypeChoice(own, f"{head} {named}: {lacks}, where float32 trains several times faster, but it does not fit "
                            f"comfortably ({sizes.format('exceed')}); set model.dtype float32 to choose it anyway")


def auto_dtype(model_path: str, device_type: str = "cpu", processes_here: int = 1,
               trust_remote_code: bool = False) -> DtypeChoice:
    """``choose_auto_dtype`` told about this machine: the checkpoint at ``model_path``, this CPU, and the memory
    available now shared by the ``processes_here`` training processes of this node (each holds its own copy)."""
    named = checkpoint_dtype(model_path)
    if device_type != "cpu" or named not in HALF_ARITHMETIC:
        return choose_auto_dtype(named, device_type, None, None, None)
    arithmetic = cpu_arithmetic(named)
    if arithmetic != ():  # computes in it, or cannot tell: the sizes do not matter
        return choose_auto_dtype(named, device_type, arithmetic, None, None)
    available = available_memory()
    return choose_auto_dtype(named, device_type, arithmetic, float32_weight_bytes(model_path, trust_remote_code),
                             None if available is None else available // max(1, processes_here))


# --- what this machine tells the rule ---------------------------------------------------------------------------------
def cpu_arithmetic(named: Any, capabilities: dict[str, Any] | None = None) -> tuple[str, ...] | None:
    """The instructions of this x86 CPU that compute on ``named`` (``HALF_ARITHMETIC``), from torch's cpuinfo
    (``capabilities``: ``torch.cpu.get_capabilities()`` unless given); None off x86 or where torch cannot say;
    empty when ``LIT_GRPO_CPU_NO_BF16_PACKING`` is set."""
    if platform.machine().lower() not in {"x86_64", "amd64", "i386", "i686", "x86"}:
        return None
    if capabilities is None:
        try:
            capabilities = dict(torch.cpu.get_capabilities())
        except (AttributeError, RuntimeError):
            return None
    if os.environ.get(NO_BF16_PACKING, "") not in ("", "0"):
        return ()
    return tuple(flag for flag in HALF_ARITHMETIC.get(str(named), ()) if capabilities.get(flag, False))


def cgroup_available(limit: int | None, usage: int, inactive_file: int) -> int | None:
    """What a memory cgroup still grants: its limit less what it holds, not counting file pages the kernel reclaims
    first (``inactive_file``, as the kubelet counts a container's working set); None without a limit.

    >>> cgroup_available(8_000, 5_000, 1_000), cgroup_available(None, 5_000, 0)
    (4000, None)
    """
    if limit is None:
        return None
    return max(0, limit - max(0, usage - inactive_file))


def read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def cgroup_memory(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory this process's cgroup (v2, else v1) still grants, or None when it sets no limit."""
    for limit_file, usage_file, directory in (("memory.max", "memory.current", root),
                                              ("memory.limit_in_bytes", "memory.usage_in_bytes", root / "memory")):
        limit, usage = read_int(directory / limit_file), read_int(directory / usage_file)
        if usage is None:
            continue
        if limit is not None and limit >= 2**60:  # cgroup v1's "no limit"
            limit = None
        try:
            stats = dict(line.split() for line in (directory / "memory.stat").read_text().splitlines())
        except (OSError, ValueError):
            stats = {}
        return cgroup_available(limit, usage, int(stats.get("inactive_file", stats.get("total_inactive_file", 0))))
    return None


def available_memory() -> int | None:
    """Memory available to this process: the machine's (``psutil``), or its cgroup's when that grants less."""
    try:
        import psutil

        machine = int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil cannot read this system: unknown
        return None
    cgroup = cgroup_memory()
    return machine if cgroup is None else min(machine, cgroup)


def float32_weight_bytes(model_path: str, trust_remote_code: bool = False) -> int | None:
    """The checkpoint's floating-point weights in float32: from its safetensors headers (no weights read), else from
    its config on the meta device (a hub id not yet downloaded); None when neither can tell."""
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if files:
        from safetensors import safe_open

        count = 0
        try:
            for file in files:
                with safe_open(str(file), framework="pt") as handle:
                    for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                        tensor = handle.get_slice(name)
                        if tensor.get_dtype() in ("BF16", "F16", "F32", "F64"):
                            count += _numel(tensor.get_shape())
        except Exception:  # noqa: BLE001 - an unreadable file is reported by the load itself
            return None
        return 4 * count
    return _meta_float32_bytes(model_path, trust_remote_code)


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _meta_float32_bytes(model_path: str, trust_remote_code: bool) -> int | None:
    import warnings

    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code),
                trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - only an estimate: unknown
        return None
    return 4 * sum(p.numel() for p in model.parameters() if p.is_floating_point())  # tied weights counted once
