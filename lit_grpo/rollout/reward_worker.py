"""Reward calls with a timeout, in a worker process (docs/guide.md#your-own-task-or-reward).

A hung pure-Python function cannot be interrupted from its own thread, so with a timeout the task's rewards run in
a forked child: the parent waits for each call's answer at most ``timeout`` seconds, then kills the child, scores
the call's completions ``failure_reward`` and starts a fresh child for the next call. One call is one reward on one
completion, or one batched reward (a TRL-style function, a reward model) on the whole batch: a ``DatasetTask``'s
rewards are called one by one, and a hung one costs only its own values. Without a timeout nothing of this runs:
rewards are called in-process as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from lit_grpo.run.worker_process import (
    ChildProcess,
    WorkerDied,
    WorkerTimedOut,
)
from lit_grpo.tasks.base import PromptRecord, ScoredCompletion, Task
from lit_grpo.tasks.single_turn.dataset import DatasetTask
from lit_grpo.tasks.rewards.answers import Column, plain_copy
from lit_grpo.tasks.rewards.functions import Completions, is_batched

Answer = TypeVar("Answer")


def serve_rewards(connection: Connection, task: Task) -> None:
    """The child's loop until it receives None: ``("group", records, texts, ids)`` is answered with
    ``task.score_group``'s scores, ``("column", index, batch)`` with ``task.column`` (a ``DatasetTask``'s reward
    ``index`` on ``batch``)."""
    while True:
        request = connection.recv()
        if request is None:
            return
        kind, *arguments = request
        if kind == "column" and isinstance(task, DatasetTask):  # only a DatasetTask's rewards are asked by column
            connection.send(task.column(*arguments))
        else:
            connection.send(task.score_group(*arguments))


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
        self.child = ChildProcess(serve_rewards, (task,), "lit-grpo-rewards")

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
        try:
            return self.child.ask(request, self.timeout)
        except WorkerTimedOut:
            unit = "call" if count > 1 else "completion"
            return failed(f"TimeoutError: the reward took longer than {self.timeout}s per {unit}")
        except WorkerDied as died:
            return failed(f"RuntimeError: the reward's worker process died ({died})")

    def reward_weights(self) -> dict[str, float]:
        return self.task.reward_weights()

    def close(self) -> None:
        """End the child process (idempotent)."""
        self.child.close()
