"""Torch's idle OpenMP threads sleep in the command instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, unless the
user set it or ``GOMP_SPINCOUNT``).

GNU OpenMP (the ``libgomp`` torch's CPU wheels load) keeps each worker thread spinning for a while after a parallel
region, so that the next region starts without a wake-up. A training loop on a small model enters a region every
few hundred microseconds, so torch's worker threads never sleep: with 2 threads on 2 cores the second core is never
free for the run's other threads (the background checkpoint writer, the draw ahead, TensorBoard's writer) or for
another process on a shared machine, and each of them runs against a spinner. Measured with
``benchmarks/speed/checkpoint_cost.py`` (docs/benchmarks.md, "What the per-epoch checkpoint costs").

``libgomp`` reads the variable once, when torch loads it, so this runs before the command's first ``import torch``;
in a process that imported torch earlier (a user's own script) it changes nothing, and that user sets the variable
in the environment. Child processes (DDP ranks, vLLM servers, the reward worker) inherit it.
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "OMP_WAIT_POLICY"
USER_SETTINGS = (WAIT_POLICY, "GOMP_SPINCOUNT")  # either, set by the user, is their choice of how threads wait


def idle_threads_sleep() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children unless the user set it (or libgomp's
    ``GOMP_SPINCOUNT``) or torch is loaded already (too late to matter); True if set."""
    if any(name in os.environ for name in USER_SETTINGS) or "torch" in sys.modules:
        return False
    os.environ[WAIT_POLICY] = "PASSIVE"
    return True
