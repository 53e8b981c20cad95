"""Several inference servers behind one engine: HTTP with failure kinds, dealing by load, failover, and one push
per adapter version for all DDP ranks (docs/scaling.md).

A request either fails because of the server (refused, reset, timed out, HTTP 5xx: ``ServerDown``; or an answer
whose shape does not fit the request, see ``server_answers``) — it is then retried on another live server and the
failed one is skipped until the next push probes it again — or because of the request (HTTP 4xx: a plain
``RuntimeError``, which failover would only repeat elsewhere). No live server left is ``ServersUnavailable``.
Only the standard library speaks HTTP; torch.distributed is used for the push.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class ServerDown(RuntimeError):
    """A server failed to answer (refused, reset, timed out, HTTP 5xx): another server may answer instead."""


class Refused(RuntimeError):
    """A server refused the request (HTTP 4xx): the request is at fault, and another server would refuse it too."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


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


def http_json(url: str, method: str, path: str, body: dict[str, Any] | None = None, api_key: str | None = None,
              timeout: float = 600.0) -> Any:
    """One JSON request to ``url + path``. A failure of the server raises ``ServerDown``, a refusal of the request
    (4xx) ``Refused``; both say which server and which request. Plain-text answers come back as text."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            text = answer.read().decode(errors="replace")  # bytes that are not UTF-8: not JSON either, said so
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:2000]
        message = f"the vLLM server at {url} refused {method} {path}: HTTP {error.code}{refusal_hint(error.code, path)}"
        if error.code >= 500:
            raise ServerDown(f"{message}: {detail}") from error
        raise Refused(f"{message}: {detail}", error.code) from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        # OSError covers refused, reset and timed-out sockets; HTTPException an answer cut off mid-way
        raise ServerDown(f"cannot reach the vLLM server at {url} ({method} {path}): {error}") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # the adapter endpoints answer in plain text


def refusal_hint(code: int, path: str) -> str:
    """What a user most likely has to fix for an HTTP error ``code`` on ``path``."""
    if code == 401:
        return " (wrong or missing api_key?)"
    if code == 404 and "lora_adapter" in path:
        return " (start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)"
    return ""


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


class ServerPool:
    """The servers of one engine, dealt requests by load. ``request(url, method, path, body)`` does the HTTP."""

    def __init__(self, urls: list[str], request: Callable[[str, str, str, dict[str, Any] | None], Any]) -> None:
        self.servers = [Server(url, alive=False, failure="not probed yet") for url in urls]  # revive() probes
        self.request = request
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

    def mark_dead(self, server: Server, reason: str) -> None:
        with self._lock:
            if not server.alive:
                return
            server.alive, server.failure = False, reason
            left = self.alive_count
        warnings.warn(f"vLLM server {server.url} failed and is skipped until the next policy push ({left} of "
                      f"{len(self.servers)} left): {reason}", RuntimeWarning, stacklevel=2)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             check: Callable[[Any], str | None] | None = None) -> Any:
        """``request`` on the least-loaded live server; a ``ServerDown`` marks that server dead and the request
        goes to the next one, and so does an HTTP 404: the server lost the adapter it was given at the push (it
        restarted since; the next push loads it again), which the others still hold. So does an answer ``check``
        finds wrong (it returns what is wrong, or None): a server that sends malformed answers is as good as down.
        None left: ``ServersUnavailable``."""
        while True:
            with self._lock:
                index = least_loaded([s.in_flight for s in self.servers], [s.alive for s in self.servers])
                if index is None:
                    raise self.unavailable()
                server = self.servers[index]
                server.in_flight += 1
            try:
                answer = self.request(server.url, method, path, body)
                problem = None if check is None else check(answer)
                if problem is None:
                    return answer
                self.mark_dead(server, f"the vLLM server at {server.url} answered {method} {path} with {problem}")
            except ServerDown as error:
                self.mark_dead(server, str(error))
            except Refused as error:
                if error.code != 404:
                    raise  # the request is at fault: every server would refuse it
                self.mark_dead(server, f"{error} (restarted since the last push?)")
            finally:
                with self._lock:
                    server.in_flight -= 1

    def on_each(self, action: Callable[[Server], None]) -> None:
        """``action`` on every live server in turn; one that fails with ``ServerDown`` is marked dead. Raises
        ``ServersUnavailable`` when none is left alive afterwards."""
        for server in self.servers:
            if server.alive:
                try:
                    action(server)
                except ServerDown as error:
                    self.mark_dead(server, str(error))
        if not self.alive_count:
            raise self.unavailable()

    def revive(self) -> None:
        """Probe each dead (or never probed) server's ``/health``; one that answers is live again."""
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
