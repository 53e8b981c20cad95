"""Reward calls with a timeout, in a worker process (docs/guide.md#your-own-task-or-reward).

A hung pure-Python function cannot be interrupted from its own thread, so with a timeout the task's rewards run in
a forked child: the parent waits for each answer at most ``timeout`` seconds, then kills the child, scores the
completion's ``failure_reward`` and starts a fresh child for the next call. Without a timeout nothing of this runs:
rewards are called in-process as before.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch

from lit_grpo.tasks.base import PromptRecord, ScoredCompletion, Task


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (elsewhere: a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve_rewards(connection: Connection, task: Task) -> None:
    """The child's loop: score each ``(record, text, ids)`` it receives until it receives None."""
    # a forked child inherits the trainer's signal handlers (Lightning's SIGTERM handler only sets a flag): restore
    # the defaults so terminate() ends it, and let it die with its parent, even one that was SIGKILLed
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then ends this child
    die_with_parent()
    # the parent's OpenMP thread pool does not survive a fork: a torch op using it (a reward model's forward) would
    # wait forever for threads that do not exist in this process; one thread runs it inline
    torch.set_num_threads(1)
    while True:
        request = connection.recv()
        if request is None:
            return
        connection.send(task.score_group(*request))


class RewardWorker:
    """``task.score`` in a child process, each call bounded by ``timeout`` seconds.

    A call that raises scores ``failure_reward`` inside the child (``Task.score`` catches it); one that hangs, or
    whose child dies, scores it here with an ``error`` saying so, and counts as not correct. Linux forks the child,
    so the task needs no pickling and a restart costs milliseconds.
    """

    def __init__(self, task: Task, timeout: float) -> None:
        if timeout <= 0:
            raise ValueError(f"reward timeout must be positive, got {timeout}")
        self.task, self.timeout = task, timeout
        self._process: Any = None
        self._connection: Connection | None = None

    def score(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> ScoredCompletion:
        return self.score_group([prompt_record], [completion_text], [completion_ids])[0]

    def score_group(self, records: Sequence[PromptRecord], texts: Sequence[str],
                    ids: Sequence[Sequence[int]]) -> list[ScoredCompletion]:
        """``task.score_group`` in the child: one call per completion, each bounded by ``timeout`` seconds, unless
        the task's rewards score whole batches (``task.batched_rewards``); then one call for the batch, bounded by
        ``timeout`` seconds per completion. A hang or a dead child scores every completion of its call
        ``failure_reward``."""
        if not getattr(self.task, "batched_rewards", False):
            return [self._call([r], [t], [i])[0] for r, t, i in zip(records, texts, ids)]
        return self._call(records, texts, ids)

    def _call(self, records: Sequence[PromptRecord], texts: Sequence[str],
              ids: Sequence[Sequence[int]]) -> list[ScoredCompletion]:
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._connection is not None
        self._connection.send((list(records), list(texts), [list(row) for row in ids]))
        try:
            if self._connection.poll(self.timeout * len(texts)):
                return self._connection.recv()
            error = f"TimeoutError: the reward took longer than {self.timeout}s per completion"
        except (EOFError, OSError):
            self._process.join(timeout=5)  # reap it, for its exit code
            error = f"RuntimeError: the reward's worker process died (exit code {self._process.exitcode})"
        self._stop(kill=True)
        return [ScoredCompletion(self.task.failure_reward, False, error) for _ in texts]

    def _start(self) -> None:
        # a forked child cannot use CUDA once the parent has: then spawn (a reward model reloads itself there)
        fork = "fork" in multiprocessing.get_all_start_methods() and not torch.cuda.is_initialized()
        context = multiprocessing.get_context("fork" if fork else "spawn")
        parent, child = context.Pipe()
        self._process = context.Process(target=serve_rewards, args=(child, self.task), daemon=True,
                                        name="lit-grpo-rewards")
        self._process.start()
        child.close()
        self._connection = parent

    def _stop(self, kill: bool) -> None:
        if self._process is None:
            return
        if not kill and self._process.is_alive():
            try:
                self._connection.send(None)
                self._process.join(timeout=5)
            except (BrokenPipeError, OSError):
                pass
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._connection.close()
        self._process, self._connection = None, None

    def close(self) -> None:
        """End the child process (idempotent)."""
        self._stop(kill=False)
