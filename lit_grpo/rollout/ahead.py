"""Asynchronous rollouts (docs/scaling.md): the next epoch's rollouts are drawn in the background while this epoch's
train.

With ``max_staleness`` k >= 1, at the start of epoch e (its own rollouts in hand) the engine is given the current
adapter only if the next epoch's rollouts would otherwise come from an adapter more than k versions old; then
epoch e + 1's prompts are drawn and scored on a background thread while epoch e trains. A version is an epoch's
starting adapter, so epoch e's rollouts are ``e - version`` versions old: k = 1 gives 0, 1, 1, 1, ...; k = 2 gives
0, 1, 2, 1, 2, ... (one push every two epochs). The sampler's log-probs are pi_old, so the clipped ratio is taken
against the policy that drew the tokens.

A checkpoint holds no pending rollout. It holds the loop state as it stood before the pending draw (prompt
cursor, completions drawn) and the adapter that draw samples from; a resumed run draws the same rollouts again
from that adapter, with the same seeds, so it continues exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.engines.base import engine_metrics
from lit_grpo.errors import InputError


def next_version(epoch: int, engine_version: int | None, max_staleness: int) -> int:
    """The adapter version epoch ``epoch + 1``'s rollouts are drawn from: the engine's, unless that would be more
    than ``max_staleness`` versions old, then ``epoch`` (the current adapter, pushed now).

    Example: k = 2, engine at 0: epochs 0 and 1 draw the next from 0, epoch 2 pushes 2 (3 - 0 > 2).
    """
    if engine_version is None or epoch + 1 - engine_version > max_staleness:
        return epoch
    return engine_version


@dataclass
class Pending:
    """A draw on the background thread, and what a checkpoint needs to draw it again."""

    epoch: int
    version: int
    future: Future
    loop_state: dict[str, int]  # the DataModule's loop state before the draw
    adapter: dict[str, torch.Tensor] = field(repr=False)  # the adapter of ``version``, on the CPU


class RolloutPrefetcher:
    """One background draw at a time (engines are not assumed thread-safe: every other use of the engine waits for
    it first), on a daemon thread: a run stopped by Ctrl-C or an error leaves it behind instead of waiting for it."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self.engine_version: int | None = None  # the adapter version the engine holds (None: unknown or newer)
        self.engine_adapter: dict[str, torch.Tensor] | None = None  # that version's LoRA weights, on the CPU
        self.pending: Pending | None = None
        self.restored: dict[str, Any] | None = None  # a checkpoint's pending draw, to be drawn again

    def submit(self, epoch: int, version: int, loop_state: dict[str, int], adapter: dict[str, torch.Tensor],
               draw: Callable[[], Any]) -> None:
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(draw())
            except BaseException as error:  # noqa: BLE001 - raised where the result is taken
                future.set_exception(error)

        threading.Thread(target=run, name="lit-grpo-rollouts", daemon=True).start()
        self.pending = Pending(epoch, version, future, loop_state, adapter)

    def take(self, epoch: int) -> tuple[Any, int] | None:
        """The pending draw's result and version if it is epoch ``epoch``'s (its error is raised here)."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        if pending.epoch != epoch:
            raise RuntimeError(f"the rollouts drawn ahead are epoch {pending.epoch}'s, not epoch {epoch}'s")
        return pending.future.result(), pending.version

    def wait(self) -> None:
        """Let the pending draw finish (its result is kept) before the engine is used otherwise."""
        if self.pending is not None:
            self.pending.future.exception()

    def state_dict(self) -> dict[str, Any]:
        pending = self.pending
        if pending is None:
            return {}
        return {"pending_epoch": pending.epoch, "pending_version": pending.version,
                "pending_loop_state": dict(pending.loop_state), "pending_adapter": pending.adapter,
                "engine_version": self.engine_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = dict(state) if state.get("pending_adapter") is not None else None

    def close(self) -> None:
        """Let the pending draw finish, and drop it (the run has ended)."""
        self.wait()
        self.pending = None

    def abandon(self) -> None:
        """Drop the pending draw without waiting for it (the run is stopping on an error or an interrupt)."""
        self.pending = None


class EpochRollouts(NamedTuple):
    """An epoch's rollouts as the DataModule takes them, drawn now or ahead, with what it reports of their draw."""

    buffer: Any
    records: list
    phases: dict[str, float]  # seconds per phase: push, generate (scoring included when drawn ahead), score, wait
    engine_metrics: dict[str, float]  # the engine's figures right after this draw (servers_alive)
    staleness: int = 0  # adapter versions between the one that drew them and the one that trains on them


@dataclass
class Drawn:
    """A finished draw, with what the main thread reads of it (the next draw may already be changing the engine)."""

    buffer: Any
    records: list
    engine_metrics: dict[str, float]  # the engine's figures right after this draw (servers_alive)
    seconds: float


class DrawingData(Protocol):
    """What drawing ahead uses of the DataModule (``RolloutDataModule``): its engine and trainer, the prompt cursor
    and budget (``PromptCursor``), the grouped draw, the policy push, and the prefetcher it owns."""

    engine: Any
    trainer: Any
    prefetch: RolloutPrefetcher
    prompts: Any
    prompts_per_epoch: int

    def draw_grouped(self, module: SamplingPolicy, records: list, epoch: int) -> Any: ...
    def next_prompts(self, count: int | None = None) -> list: ...
    def sync_policy(self, module: SamplingPolicy) -> None: ...
    def push_policy_now(self, module: SamplingPolicy) -> None: ...


def drawing(data: DrawingData, module: SamplingPolicy, records: list, epoch: int) -> Callable[[], Drawn]:
    """Epoch ``epoch``'s grouped draw of ``records``, to run now or on the background thread."""
    def draw() -> Drawn:
        start = time.perf_counter()
        buffer = data.draw_grouped(module, records, epoch)
        return Drawn(buffer, records, engine_metrics(data.engine), time.perf_counter() - start)
    return draw


def rollouts_ahead(data: DrawingData, module: SamplingPolicy, epoch: int) -> EpochRollouts:
    """Epoch ``epoch``'s rollouts (drawn ahead, or now on the first epoch and after a resume), with their phase
    seconds, the engine's figures after their draw and their staleness (``epoch - version``), and the next epoch's
    draw started in the background."""
    ahead: RolloutPrefetcher = data.prefetch
    started = time.perf_counter()
    taken = ahead.take(epoch)
    phases = {"wait": time.perf_counter() - started, "push": 0.0}
    drawn, version = draw_now(data, module, epoch, phases) if taken is None else taken
    if drawn.buffer.sampler_logp is None:  # pi_old would be recomputed by a policy that did not draw the tokens
        raise InputError(f"data.max_staleness {ahead.max_staleness}: the engine {type(data.engine).__name__} returned "
                         "no log-probs with its tokens; drawing ahead takes pi_old from the sampler")
    phases["generate"] = drawn.seconds
    if draws_after(data, epoch):
        launch(data, module, epoch, phases)
    return EpochRollouts(drawn.buffer, drawn.records, phases, drawn.engine_metrics, epoch - version)


def draws_after(data: DrawingData, epoch: int) -> bool:
    """Whether another epoch will want rollouts after ``epoch`` (the epoch limit and the budget allow one)."""
    limit = data.trainer.max_epochs
    within_limit = limit is None or limit < 0 or epoch + 1 < limit
    return within_limit and data.prompts.affordable_groups(data.prompts_per_epoch) > 0


def draw_now(data: DrawingData, module: SamplingPolicy, epoch: int, phases: dict[str, float]) -> tuple[Drawn, int]:
    """The first epoch's draw, or a resumed run's pending one drawn again from the checkpoint's adapter (when the
    run resumes at that draw's epoch; a checkpoint from the middle of an epoch resumes as the synchronous loop does)."""
    ahead: RolloutPrefetcher = data.prefetch
    restored, ahead.restored = ahead.restored, None
    start = time.perf_counter()
    if restored is None or restored["pending_epoch"] != epoch:
        data.sync_policy(module)
        ahead.engine_version, ahead.engine_adapter, version = epoch, module.adapter_copy(), epoch
    else:
        with module.adapter_swapped(restored["pending_adapter"]):  # the module swaps its own weights
            data.push_policy_now(module)
        ahead.engine_version, ahead.engine_adapter = restored["engine_version"], restored["pending_adapter"]
        version = restored["pending_version"]
    phases["push"] += time.perf_counter() - start
    records = data.next_prompts(data.prompts.affordable_groups(data.prompts_per_epoch))
    return drawing(data, module, records, epoch)(), version


def launch(data: DrawingData, module: SamplingPolicy, epoch: int, phases: dict[str, float]) -> None:
    """Push the current adapter if the next draw needs it (``next_version``), then draw epoch ``epoch + 1``'s
    rollouts on the background thread."""
    ahead: RolloutPrefetcher = data.prefetch
    version = next_version(epoch, ahead.engine_version, ahead.max_staleness)
    if version != ahead.engine_version:
        start = time.perf_counter()
        data.sync_policy(module)
        ahead.engine_version, ahead.engine_adapter = epoch, module.adapter_copy()
        phases["push"] += time.perf_counter() - start
    loop_state = data.prompts.loop_state()
    records = data.next_prompts(data.prompts.affordable_groups(data.prompts_per_epoch))
    ahead.submit(epoch + 1, version, loop_state, ahead.engine_adapter, drawing(data, module, records, epoch + 1))


def epoch_costs(push: float, generate: float, train: float) -> tuple[float, float]:
    """The cost model of one epoch (docs/scaling.md), in seconds: ``(in turn, drawn ahead)`` = (push + generate +
    train, push + max(generate, train)); ``generate`` includes scoring. Read off a synchronous run, it says what drawing
    ahead would gain."""
    return push + generate + train, push + max(generate, train)
