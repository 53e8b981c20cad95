"""Reward calls with a timeout, in a worker process (docs/guide.md#your-own-task-or-reward).

A hung pure-Python function cannot be interrupted from its own thread, so with a timeout the task's rewards run in
a forked child: the parent waits for each call's answer at most ``timeout`` seconds, then kills the child, scores
the call's completions ``failure_reward`` and starts a fresh child for the next call. One call is one reward on one
completion, or one batched reward (a TRL-style function, a reward model) on the whole batch: a ``DatasetTask``'s
rewards are called one by one, and a hung one costs only its own values. Without a timeout nothing of this runs:
rewards are called in-process as before.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

import torch

from lit_grpo.tasks.base import PromptRecord, ScoredCompletion, Task
from lit_grpo.tasks.dataset import DatasetTask
from lit_grpo.tasks.reward_answers import Column, plain_copy
from lit_grpo.tasks.reward_functions import Completions, is_batched

Answer = TypeVar("Answer")


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (elsewhere: a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def serve_rewards(connection: Connection, task: Task) -> None:
    """The child's loop until it receives None: ``("group", records, texts, ids)`` is answered with
    ``task.score_group``'s scores, ``("column", index, batch)`` with ``task.column`` (a ``DatasetTask``'s reward
    ``index`` on ``batch``)."""
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
        kind, *arguments = request
        connection.send(task.score_group(*arguments) if kind == "group" else task.column(*arguments))


class RewardWorker:
    """``task.score_group`` with each reward call in a child process, bounded by ``timeout`` seconds.

    A call that raises scores ``failure_reward`` inside the child (the task catches it); one that hangs, or whose
    child dies, scores it here with an ``error`` saying so. Linux forks the child, so the task needs no pickling and
    a restart costs milliseconds.
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
        """The scores of ``N`` completions: a ``DatasetTask`` combines here the columns its rewards' calls give in
        the child (``column``); any other task is scored one completion per call. A call that hangs or kills the
        child scores each completion of that call ``failure_reward``."""
        if isinstance(self.task, DatasetTask):
            return self.task.score_group(records, texts, ids, column=self.column)

        def failed(record: PromptRecord, text: str) -> Callable[[str], list[ScoredCompletion]]:
            # correctness is the task's, whatever became of the reward: checked here, accuracy stays true
            return lambda error: [ScoredCompletion(self.task.failure_reward,
                                                   self.task.is_correct(plain_copy(record), text), error)]

        return [self._call(("group", [r], [t], [list(i)]), 1, failed(r, t))[0] for r, t, i in zip(records, texts, ids)]

    def column(self, index: int, batch: Completions) -> Column:
        """A ``DatasetTask``'s reward ``index`` on ``batch`` in the child: one call for a batched reward, one per
        completion for a ``Reward``, each bounded by ``timeout`` seconds; values ``[N]`` and errors ``[N]``."""
        assert isinstance(self.task, DatasetTask)
        name = self.task.names[index]
        calls = [batch] if is_batched(self.task.rewards[index]) else [batch.one(i) for i in range(len(batch.texts))]
        values: list[float | None] = []
        errors: list[str | None] = []
        for call in calls:
            count = len(call.texts)
            got, failures = self._call(("column", index, call), count,
                                       lambda error, n=count: ([None] * n, [f"{name}: {error}"] * n))
            values += got
            errors += failures
        return values, errors

    def _call(self, request: tuple[Any, ...], count: int, failed: Callable[[str], Answer]) -> Answer:
        """The child's answer to ``request`` (a call on ``count`` completions), or ``failed(error)`` when it takes
        longer than ``timeout`` seconds or the child dies (the child is then killed; the next call starts a fresh
        one)."""
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._connection is not None
        self._connection.send(request)
        try:
            if self._connection.poll(self.timeout):
                return self._connection.recv()
            unit = "call" if count > 1 else "completion"
            error = f"TimeoutError: the reward took longer than {self.timeout}s per {unit}"
        except (EOFError, OSError):
            self._process.join(timeout=5)  # reap it, for its exit code
            error = f"RuntimeError: the reward's worker process died (exit code {self._process.exitcode})"
        self._stop(kill=True)
        return failed(error)

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
