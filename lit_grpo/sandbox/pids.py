"""A pids cgroup per call, where this process may make one (root, with the cgroup filesystem writable): the one
bound on processes that holds for root too (``RLIMIT_NPROC`` does not bind root). The supervisor joins it before
anything else, so every process of the call is in it."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

ROOTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1's pids hierarchy, v2's unified one
_numbers = itertools.count()


def make_group(processes: int) -> Path | None:
    """A new cgroup allowing ``processes`` processes (and the supervisor's two), or None where none can be made."""
    for root in ROOTS:
        if not (root / "cgroup.procs").exists() or not os.access(root, os.W_OK):
            continue
        if root == ROOTS[1] and "pids" not in (root / "cgroup.subtree_control").read_text().split():
            continue  # v2 without the pids controller for children
        group = root / f"lit-grpo-sandbox-{os.getpid()}-{next(_numbers)}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(processes + 2))
            return group
        except OSError:
            remove_group(group)
    return None


def remove_group(group: Path | None) -> None:
    """Remove the (emptied) cgroup; its last processes may take a moment to leave it."""
    if group is None:
        return
    for _ in range(200):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
