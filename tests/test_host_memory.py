"""Freed host memory goes back to the OS under the lit-grpo command (lit_grpo.run.host_memory), run in child processes
because glibc's setting is per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lit_grpo.run import host_memory

# Frees a 16 MiB block (glibc then raises its mmap threshold to 16 MiB), then allocates 40 blocks of 8 MiB, each
# followed by a small block that stays alive (so the heap cannot shrink from its top), frees the 8 MiB blocks and
# prints how much of their 320 MiB the process still holds.
PROGRAM = """
import sys, psutil, torch
from lit_grpo.run.host_memory import return_freed_memory
if sys.argv[1] == "fixed":
    assert return_freed_memory()
rss = lambda: psutil.Process().memory_info().rss
del_me = torch.ones(4 * 2**20)
del del_me
start = rss()
big, small = [], []
for _ in range(40):
    big.append(torch.ones(2 * 2**20))
    small.append(torch.ones(1024))
del big
print((rss() - start) / 2**20)
"""


def held_mib(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_activations_leave_the_process_only_with_the_fixed_threshold():
    assert held_mib("dynamic") > 250  # glibc's default keeps the freed 8 MiB blocks in the heap
    assert held_mib("fixed") < 20  # each was its own mapping, unmapped when freed


def test_a_users_own_glibc_setting_is_kept(monkeypatch):
    monkeypatch.setenv(host_memory.USER_SETTING, "65536")
    assert host_memory.return_freed_memory() is False
