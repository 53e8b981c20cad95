"""Host memory that is freed goes back to the operating system (glibc only).

glibc serves a request below its mmap threshold from the heap, and raises that threshold (up to 32 MiB) each time
it frees a mapped block. A training step allocates and frees activations of a few MiB per layer (a [8 x 512, 896]
bf16 hidden state is 7 MiB), so after the first step they all come from the heap, whose holes are not returned:
on a 24-layer Qwen2.5-0.5B-width model at 8 x 512 tokens one GRPO step peaked at 4.7 GiB of RSS, 2.3 GiB with the
threshold fixed (benchmarks/memory/memory.py). Fixing it maps every block of at least ``MMAP_THRESHOLD`` bytes on its
own and unmaps it when freed: the peak RSS follows live memory, at the price of the page faults of fresh mappings
(that step took 104 s instead of 84 s on this CPU; on a GPU the activations are not host memory).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

MMAP_THRESHOLD = 2**20  # bytes; of 1, 4 and 32 MiB, 1 MiB gave the lowest peaks in benchmarks/memory/memory.py
M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h
USER_SETTING = "MALLOC_MMAP_THRESHOLD_"  # glibc's own environment tunable: a user who set it keeps it


def return_freed_memory(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; True if set, False where there is no
    glibc (macOS, musl) or the user set ``MALLOC_MMAP_THRESHOLD_`` themselves."""
    if os.environ.get(USER_SETTING) is not None:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, int(threshold)))
