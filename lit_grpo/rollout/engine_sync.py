"""Pushing the policy into the rollout engine (docs/guide.md#layout): once per optimizer step at most, and only once
the draw ahead (if any) is done with the engine."""

from __future__ import annotations

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.engines import RolloutEngine
from lit_grpo.rollout.ahead import RolloutPrefetcher


class EngineSync:
    """Which weights ``engine`` holds: those of optimizer step ``pushed_at`` (None: unknown, push again)."""

    def __init__(self, engine: RolloutEngine, prefetch: RolloutPrefetcher) -> None:
        self.engine, self.prefetch = engine, prefetch
        self.pushed_at: int | None = None

    def sync(self, module: SamplingPolicy) -> None:
        """Push the current policy into the engine, once per optimizer step at most."""
        step = module.weights_version()
        if self.pushed_at != step or step < 0:
            self.push_now(module)
            self.pushed_at = step

    def push_now(self, module: SamplingPolicy) -> None:
        """Push the policy's weights as they are, once the draw ahead (if any) is done with the engine."""
        self.prefetch.wait()
        self.engine.push_policy(module.policy)
        self.pushed_at = None
        self.prefetch.engine_version = None  # not a version the draws ahead know: the next one pushes anew

    def forget(self) -> None:
        """The engine was closed and holds no policy: the next use pushes it again."""
        self.pushed_at = None
