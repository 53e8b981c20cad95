"""Several inference servers behind one engine: dealing by load, failover, hedged requests, and one push per
adapter version for all DDP ranks (docs/scaling.md).

A request either fails because of the server (refused, reset, timed out, HTTP 5xx: ``ServerDown``; or an answer
whose shape does not fit the request, see ``server_answers``) — it is then retried on another live server and the
failed one is skipped until the next push probes it again — or because of the request (HTTP 4xx: a plain
``RuntimeError``, which failover would only repeat elsewhere). A request still unanswered past its deadline
(``hedge``) is sent to another live server too, and the late server is skipped like a failed one. No live server
left is ``ServersUnavailable``. HTTP is ``server_http``'s; torch.distributed is used for the push.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from lit_grpo.engines.hedge import HedgeRule
from lit_grpo.engines.server_http import Cancel, Refused, ServerDown, http_json  # noqa: F401 - re-exported

T = TypeVar("T")


class ServersUnavailable(RuntimeError):
    """No server is left to generate. Its message names every server and why it was given up; the ``lit-grpo``
    command adds how to go on (the checkpoint to resume from, or to run again if no epoch had ended) and exits
    with code 1."""


def servers_unavailable(reasons: dict[str, str]) -> ServersUnavailable:
    """The error for a pool whose every server failed: one paragraph, each server and why, in the configured order."""
    listing = "; ".join(f"{url}: {one_line(reason)}" for url, reason in reasons.items())
    return ServersUnavailable(f"no vLLM server is left to generate rollouts ({len(reasons)} configured: {listing}). "
                              "Restart the servers (or fix data.engine.init_args.urls).")


def one_line(text: str, limit: int = 600) -> str:
    """``text`` on one line, its middle cut when longer than ``limit``: a server's log tail or an error page ends
    with what went wrong, and a paragraph naming several servers must stay readable."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return f"{flat[:limit // 3]} [...] {flat[-(limit - limit // 3):]}"


def least_loaded(in_flight: list[int], alive: list[bool]) -> int | None:
    """Index of the live server with the fewest requests in flight (the first of equals); None when none is alive.

    >>> least_loaded([2, 0, 1], [True, True, True]), least_loaded([2, 0, 1], [True, False, True])
    (1, 2)
    """
    candidates = [i for i, up in enumerate(alive) if up]
    return min(candidates, key=lambda i: (in_flight[i], i)) if candidates else None


@dataclass
class Server:
    url: str
    alive: bool = True
    in_flight: int = 0
    failure: str = ""  # why it was last given up
    adapter: str | None = None  # the adapter this process loaded there last (None: none, or another rank did)
    warned_late: bool = False  # named in a warning for being late once: later lateness is counted, not warned


@dataclass(eq=False)
class Attempt:
    """One server's try at one request, on a thread of its own so that the caller can stop waiting for it."""

    server: Server
    started: float = field(default_factory=time.monotonic)
    cancel: Cancel = field(default_factory=Cancel)


class ServerPool:
    """The servers of one engine, dealt requests by load. ``request(url, method, path, body)`` does the HTTP (with
    ``http_json``, so that a late exchange can be cut off); ``hedge`` (None: never) says when a request is late."""

    def __init__(self, urls: list[str], request: Callable[[str, str, str, dict[str, Any] | None], Any],
                 hedge: HedgeRule | None = None) -> None:
        self.servers = [Server(url, alive=False, failure="not probed yet") for url in urls]  # revive() probes
        self.request = request
        self.hedge = hedge
        self.hedged = 0  # requests sent again to another server since the last push (rollout/requests_hedged)
        self._lock = threading.Lock()  # generate() calls from a thread pool

    @property
    def alive_count(self) -> int:
        return sum(server.alive for server in self.servers)

    def alive_urls(self) -> list[str]:
        return [server.url for server in self.servers if server.alive]

    def set_alive(self, urls: list[str]) -> None:
        """Take another process's view of which servers are live (rank 0's, after its push)."""
        for server in self.servers:
            server.alive = server.url in urls
        self.hedged = 0  # a push: a new count

    def mark_dead(self, server: Server, reason: str) -> None:
        with self._lock:
            if not server.alive:
                return
            server.alive, server.failure = False, reason
            left = self.alive_count
        warnings.warn(f"vLLM server {server.url} failed and is skipped until the next policy push ({left} of "
                      f"{len(self.servers)} left): {reason}", RuntimeWarning, stacklevel=2)

    def mark_late(self, server: Server, what: str, deadline: float, rule: str, next_step: str) -> bool:
        """Skip ``server`` until the next push: it has not finished ``what`` within ``deadline`` seconds (``rule``
        says how that was set; ``next_step`` what happens to its work). Never the last live server: with nothing
        to send the work to, it is waited for (up to ``request_timeout``). Warns once per server and run; later
        lateness is counted in ``rollout/requests_hedged``. False when the server was not taken out."""
        with self._lock:
            if not server.alive or self.alive_count <= 1:
                return False
            server.alive, server.failure = False, f"no answer to {what} within {deadline:.1f}s"
            left, first = self.alive_count, not server.warned_late
            server.warned_late = True
        if first:
            knobs = "data.engine.init_args.hedge_factor and hedge_min_seconds"
            warnings.warn(f"vLLM server {server.url} is late: no answer to {what} within {deadline:.1f}s ({rule}; "
                          f"{knobs}). {next_step} It is skipped until the next policy push ({left} of "
                          f"{len(self.servers)} servers left), which probes /health and loads the adapter there "
                          "again. If it is late again it is skipped again without another warning "
                          "(rollout/requests_hedged counts the requests sent again).", RuntimeWarning, stacklevel=2)
        return True

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             check: Callable[[Any], str | None] | None = None, tokens: int | None = None) -> Any:
        """``request`` on the least-loaded live server; a ``ServerDown`` marks that server dead and the request
        goes to the next one, and so does an HTTP 404: the server lost the adapter it was given at the push (it
        restarted since; the next push loads it again), which the others still hold. So does an answer ``check``
        finds wrong (it returns what is wrong, or None): a server that sends malformed answers is as good as down.
        A request for ``tokens`` tokens still unanswered past the hedge deadline is sent, unchanged (same seed), to
        another live server too; the first answer wins, the other exchange is cut off, and the late server is
        skipped (``mark_late``). None left: ``ServersUnavailable``."""
        outcomes: queue.Queue[tuple[Attempt, str, Any]] = queue.Queue()
        running: list[Attempt] = []
        try:
            while True:
                if not running:
                    attempt = self._launch(method, path, body, check, outcomes, busy=[])
                    if attempt is None:
                        raise self.unavailable()
                    running.append(attempt)
                try:
                    attempt, kind, value = outcomes.get(timeout=self._wait(running, tokens))
                except queue.Empty:
                    self._hedge_if_late(method, path, body, check, outcomes, running, tokens)
                    continue
                running.remove(attempt)
                if kind == "answer":
                    if self.hedge is not None and tokens is not None:
                        self.hedge.record(time.monotonic() - attempt.started, tokens)
                    return value
                if kind == "raise":
                    raise value  # the request is at fault (HTTP 4xx), or a bug: every server would do the same
                self.mark_dead(attempt.server, value)
        finally:
            for attempt in running:  # the losers: their threads end at once, and the servers drop the request
                attempt.cancel.cancel()

    def _wait(self, running: list[Attempt], tokens: int | None) -> float | None:
        """How long to wait for an outcome before looking at the deadline again (None: until one comes). The
        deadline moves as other requests are answered, so it is looked at again at least every second."""
        if self.hedge is None or tokens is None:
            return None
        with self._lock:
            busy = {id(attempt.server) for attempt in running}
            spare = any(server.alive and id(server) not in busy for server in self.servers)
        if not spare:
            return None  # nowhere to send it: request_timeout bounds the wait
        deadline = self.hedge.deadline(tokens)
        if deadline is None:
            return 1.0
        return min(1.0, max(0.0, running[-1].started + deadline - time.monotonic()))

    def _hedge_if_late(self, method: str, path: str, body: dict[str, Any] | None,
                       check: Callable[[Any], str | None] | None, outcomes: queue.Queue, running: list[Attempt],
                       tokens: int | None) -> None:
        """Send the request to another live server too when its newest attempt is past the deadline."""
        assert self.hedge is not None and tokens is not None
        latest = running[-1]
        deadline = self.hedge.deadline(tokens)
        if deadline is None or time.monotonic() - latest.started < deadline:
            return
        self.mark_late(latest.server, f"{method} {path}", deadline, self.hedge.describe(tokens),
                       "Its requests are sent again, with the same seeds, to the other servers, and the first "
                       "answer is used.")
        attempt = self._launch(method, path, body, check, outcomes, busy=[a.server for a in running])
        if attempt is not None:
            with self._lock:
                self.hedged += 1
            running.append(attempt)

    def _launch(self, method: str, path: str, body: dict[str, Any] | None,
                check: Callable[[Any], str | None] | None, outcomes: queue.Queue,
                busy: list[Server]) -> Attempt | None:
        """Start the request on the least-loaded live server not in ``busy``; None when there is none."""
        with self._lock:
            alive = [server.alive and all(server is not other for other in busy) for server in self.servers]
            index = least_loaded([s.in_flight for s in self.servers], alive)
            if index is None:
                return None
            attempt = Attempt(self.servers[index])
            attempt.server.in_flight += 1
        threading.Thread(target=self._attempt, args=(attempt, method, path, body, check, outcomes), daemon=True,
                         name=f"lit-grpo request to {attempt.server.url}").start()
        return attempt

    def _attempt(self, attempt: Attempt, method: str, path: str, body: dict[str, Any] | None,
                 check: Callable[[Any], str | None] | None, outcomes: queue.Queue) -> None:
        """One server's try, reported to ``outcomes`` as (attempt, kind, value): ``answer``, ``down`` (the
        server's fault: the reason) or ``raise`` (the request's fault: the error). A cancelled try reports
        nothing: another server answered."""
        attempt.cancel.enter()
        url = attempt.server.url
        try:
            answer = self.request(url, method, path, body)
            problem = None if check is None else check(answer)
            outcome = ("answer", answer) if problem is None else (
                "down", f"the vLLM server at {url} answered {method} {path} with {problem}")
        except ServerDown as error:
            outcome = ("down", str(error))
        except Refused as error:
            # 404: the server lost the adapter of the push (restarted since); any other refusal is the request's
            outcome = ("down", f"{error} (restarted since the last push?)") if error.code == 404 else ("raise", error)
        except Exception as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome = ("raise", error)
        finally:
            with self._lock:
                attempt.server.in_flight -= 1
        if not attempt.cancel.cancelled:
            outcomes.put((attempt, *outcome))

    def on_each(self, action: Callable[[Server], None]) -> None:
        """``action`` on every live server at once, each on a thread of its own; one that fails with
        ``ServerDown`` is marked dead, and one still busy past the push deadline (``HedgeRule.push_deadline``, set
        once others have finished) is cut off and skipped (``mark_late``). Any other error is raised. Raises
        ``ServersUnavailable`` when none is left alive afterwards."""
        outcomes: queue.Queue[tuple[Attempt, BaseException | None]] = queue.Queue()
        pending = [Attempt(server) for server in self.servers if server.alive]
        for attempt in pending:
            threading.Thread(target=self._act, args=(attempt, action, outcomes), daemon=True,
                             name=f"lit-grpo push to {attempt.server.url}").start()
        finished: list[float] = []  # seconds each finished server took
        patient = self.hedge is None  # True: wait for every server (up to request_timeout)
        try:
            while pending:
                deadline = None if patient else self.hedge.push_deadline(finished)
                wait = None if deadline is None else max(0.0, pending[0].started + deadline - time.monotonic())
                try:
                    attempt, error = outcomes.get(timeout=wait)
                except queue.Empty:
                    assert self.hedge is not None and deadline is not None
                    rule = (f"{self.hedge.factor:g} × the slowest of the {len(finished)} other server(s)' loads, at "
                            f"least {self.hedge.floor:g}s")
                    for late in list(pending):
                        if self.mark_late(late.server, "the adapter load of the policy push", deadline, rule,
                                          "The push goes on without it."):
                            pending.remove(late)
                            late.cancel.cancel()
                    patient = bool(pending)  # a server that could not be left out (the last live one) is waited for
                    continue
                pending.remove(attempt)
                if error is None:
                    finished.append(time.monotonic() - attempt.started)
                elif isinstance(error, ServerDown):
                    self.mark_dead(attempt.server, str(error))
                else:
                    raise error
        finally:
            for attempt in pending:  # only after an error: cut the others off
                attempt.cancel.cancel()
        if not self.alive_count:
            raise self.unavailable()

    @staticmethod
    def _act(attempt: Attempt, action: Callable[[Server], None], outcomes: queue.Queue) -> None:
        attempt.cancel.enter()
        try:
            action(attempt.server)
            outcomes.put((attempt, None))
        except Exception as error:  # noqa: BLE001 - judged and raised again in the caller's thread
            outcomes.put((attempt, error))

    def revive(self) -> None:
        """Probe each dead (or never probed) server's ``/health``; one that answers is live again. Starts a new
        count of hedged requests (one per push)."""
        self.hedged = 0
        for server in self.servers:
            if server.alive:
                continue
            try:
                self.request(server.url, "GET", "/health", None)
                server.alive, server.failure = True, ""
            except ServerDown as error:
                server.failure = str(error)
                warnings.warn(f"vLLM server {server.url} does not answer; skipped until the next policy push: {error}",
                              RuntimeWarning, stacklevel=2)

    def unavailable(self) -> ServersUnavailable:
        return servers_unavailable({s.url: s.failure or "not answering" for s in self.servers})


def distributed_peers(cached: Any = None) -> tuple[int, int, Any]:
    """``(rank, world size, group)`` for a push shared by every rank; ``(0, 1, None)`` outside a multi-process
    run. The engine never sees the trainer: under Lightning's DDP the default process group is up before the first
    push, and every rank pushes at the same optimizer steps (``RolloutDataModule.sync_policy``), so a push can be a
    collective. It runs on a gloo group of its own (``cached`` once made): CPU objects whatever the training backend,
    and never interleaved with the training's own collectives."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 0, 1, None
    group = cached if cached is not None else dist.new_group(backend="gloo")
    return dist.get_rank(), dist.get_world_size(), group


def decided_by_rank_zero(decide: Callable[[], T], rank: int, group: Any) -> T:
    """``decide()`` on rank 0 once every rank has come here, its result on every rank. An error on
    rank 0 is raised on every rank: rank 0's own, the others' as the same kind with the same message."""
    import torch.distributed as dist

    outcome: list[Any] = [None]
    error: BaseException | None = None
    # every rank is done with the servers first: rank 0's swap unloads the adapter a rank drawing ahead
    # (data.max_staleness) may still be sampling with
    dist.barrier(group=group)
    if rank == 0:
        try:
            outcome[0] = ("ok", decide())
        except Exception as caught:  # noqa: BLE001 - every rank must hear of it, or the others wait forever
            error = caught
            kind = ServersUnavailable if isinstance(caught, ServersUnavailable) else RuntimeError
            outcome[0] = ("error", kind, f"{caught}" if kind is ServersUnavailable else f"rank 0: {caught}")
    dist.broadcast_object_list(outcome, src=0, group=group)
    if error is not None:
        raise error
    if outcome[0][0] == "error":
        raise outcome[0][1](outcome[0][2])
    return outcome[0][1]
