"""How long to wait for one server before asking another: the hedged request of Dean and Barroso's "The Tail at
Scale" (docs/scaling.md#several-vllm-servers).

A request still unanswered well past what this run's requests have taken is sent again to another live server;
the first answer wins and the late server is skipped until the next push. The rule is a pure function of the
recent answers, so it can be checked by hand; ``server_pool`` applies it.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

HEDGE_WINDOW = 16  # answers the deadline looks back on: a server's warm-up or an old load leaves it within an epoch


def hedge_deadline(seconds_per_token: Sequence[float], max_new_tokens: int, request_timeout: float,
                   factor: float, floor: float) -> float | None:
    """Seconds a request for ``max_new_tokens`` tokens waits for its server before it is hedged; None: it is not,
    and ``request_timeout`` alone bounds the wait.

    ``seconds_per_token`` (``[k]``, k <= ``HEDGE_WINDOW``): this run's last answered requests, each its wall time
    divided by the ``max_new_tokens`` it asked for. The deadline is ``factor`` × their median × ``max_new_tokens``,
    raised to ``floor``; None when no request has been answered yet (nothing says what is late) or when the deadline
    reaches ``request_timeout`` (the request would fail first).

    >>> hedge_deadline([0.5, 0.1, 0.2], 10, 600.0, factor=4.0, floor=5.0)  # 4 × 0.2 × 10
    8.0
    >>> hedge_deadline([0.01], 6, 600.0, factor=4.0, floor=5.0), hedge_deadline([], 6, 600.0, factor=4.0, floor=5.0)
    (5.0, None)
    """
    if not seconds_per_token:
        return None
    deadline = max(floor, factor * statistics.median(seconds_per_token) * max_new_tokens)
    return deadline if deadline < request_timeout else None


def push_deadline(finished_seconds: Sequence[float], request_timeout: float, factor: float,
                  floor: float) -> float | None:
    """Seconds a push waits for a server still loading the adapter once others have (``finished_seconds``, ``[k]``,
    how long each took): ``factor`` × the slowest of them, raised to ``floor``; None while none has finished or
    when that reaches ``request_timeout``. A push cannot be hedged (every server needs the adapter), but the late
    server can be left out until the next one.

    >>> push_deadline([0.2, 3.0], 600.0, factor=4.0, floor=5.0), push_deadline([0.2], 600.0, factor=4.0, floor=5.0)
    (12.0, 5.0)
    """
    if not finished_seconds:
        return None
    deadline = max(floor, factor * max(finished_seconds))
    return deadline if deadline < request_timeout else None


@dataclass
class HedgeRule:
    """The hedging knobs of one engine and the answers it has seen (requests answer on many threads)."""

    factor: float
    floor: float
    request_timeout: float
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=HEDGE_WINDOW))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, seconds: float, max_new_tokens: int) -> None:
        """An answered request: ``seconds`` from sending it to its answer."""
        with self._lock:
            self.recent.append(seconds / max(max_new_tokens, 1))

    def seen(self) -> list[float]:
        """The seconds per token of the last answers, oldest first."""
        with self._lock:
            return list(self.recent)

    def deadline(self, max_new_tokens: int) -> float | None:
        return hedge_deadline(self.seen(), max_new_tokens, self.request_timeout, self.factor, self.floor)

    def describe(self, max_new_tokens: int) -> str:
        """How ``deadline(max_new_tokens)`` was set, for a warning."""
        seen = self.seen()
        median = statistics.median(seen) if seen else float("nan")
        return (f"{self.factor:g} × {median:.3g}s per token, the median of this run's last {len(seen)} answers, × "
                f"max_new_tokens {max_new_tokens}, at least {self.floor:g}s")

    def push_deadline(self, finished_seconds: Sequence[float]) -> float | None:
        return push_deadline(finished_seconds, self.request_timeout, self.factor, self.floor)
