"""One JSON request to one inference server, with its failure kinds, and a way for another thread to cut it off.

A hedged request (``server_pool``) stops waiting for a late server once another has answered: ``Cancel`` lets the
thread that waits shut the late exchange's socket, so the thread blocked reading it ends at once (with
``ServerDown``, which nobody reads) instead of holding a connection for ``request_timeout``; a vLLM server drops
a request whose client went away. Only the standard library speaks HTTP (``http.client``: a connection object
another thread can reach). Servers are reached directly, never through an ``http_proxy``: they are the run's own.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
from typing import Any


class ServerDown(RuntimeError):
    """A server failed to answer (refused, reset, timed out, HTTP 5xx): another server may answer instead."""


class Refused(RuntimeError):
    """A server refused the request (HTTP 4xx): the request is at fault, and another server would refuse it too."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Cancel:
    """Cuts off the HTTP exchanges of one thread (the one that ran ``enter()``): ``cancel()`` from any thread shuts
    the socket of the exchange in progress, and any later one fails at once. Both end in ``ServerDown``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self.cancelled = False

    def enter(self) -> None:
        """Make this the calling thread's ``Cancel``: ``http_json`` on this thread registers its connection here."""
        _current.cancel = self

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            connection = self._connection
        sock = connection.sock if connection is not None else None
        if sock is not None:
            try:  # shutdown, not close: it wakes a recv blocked in the other thread
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def attach(self, connection: http.client.HTTPConnection | None) -> None:
        """Track ``connection`` (None: the exchange is over); raises ``ServerDown`` if cancelled already."""
        with self._lock:
            self._connection = connection
            if self.cancelled and connection is not None:
                raise ServerDown("the request was cancelled: another server answered it first")


_current = threading.local()  # the running thread's Cancel, if any


def http_json(url: str, method: str, path: str, body: dict[str, Any] | None = None, api_key: str | None = None,
              timeout: float = 600.0) -> Any:
    """One JSON request to ``url + path``. A failure of the server raises ``ServerDown``, a refusal of the request
    (4xx) ``Refused``; both say which server and which request. Plain-text answers come back as text. On a thread
    that entered a ``Cancel``, that ``Cancel`` can cut the exchange off."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    cancel: Cancel | None = getattr(_current, "cancel", None)
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        connection = kind(parts.hostname or "", parts.port, timeout=timeout)
        try:
            if cancel is not None:
                cancel.attach(connection)
            connection.connect()
            if cancel is not None:
                cancel.attach(connection)  # cancelled while connecting: the socket was not there to shut
            connection.request(method, parts.path.rstrip("/") + path, body=data, headers=headers)
            answer = connection.getresponse()
            status, text = answer.status, answer.read().decode(errors="replace")  # not UTF-8: not JSON either
        finally:
            if cancel is not None:
                cancel.attach(None)
            connection.close()
    except (OSError, http.client.HTTPException, ValueError) as error:
        # OSError covers refused, reset, cut-off and timed-out sockets; HTTPException an answer cut off mid-way
        raise ServerDown(f"cannot reach the vLLM server at {url} ({method} {path}): {error}") from error
    if status >= 400:
        message = f"the vLLM server at {url} refused {method} {path}: HTTP {status}{refusal_hint(status, path)}"
        if status >= 500:
            raise ServerDown(f"{message}: {text[:2000]}")
        raise Refused(f"{message}: {text[:2000]}", status)
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
