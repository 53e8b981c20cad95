"""Where an engine-started inference server listens: loopback by default, an API key when exposed
(docs/guide.md#rollout-engines).

A server an engine starts for itself (e.g. ``vllm serve`` for the ``vllm_server`` engine) is reachable from this
machine only unless the user asks otherwise; one bound to another interface must be given an API key.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from lit_grpo.errors import InputError

LOOPBACK = "127.0.0.1"
API_KEY_ENV = "VLLM_API_KEY"  # read by `vllm serve`; passing the key in the environment keeps it out of `ps`


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (the kernel's choice); the server binds it moments later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_taken(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now (another process holds it, or it is not this machine's to
    bind), or None. The probe reuses addresses as servers do, so a port left in TIME_WAIT counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.strerror or str(error)
    return None


def refuse_taken_port(host: str, port: int, knob: str) -> None:
    """``InputError`` naming the port and ``knob`` when a server the engine starts could not listen on it."""
    reason = port_taken(host, port)
    if reason is not None:
        raise InputError(f"{knob}: port {port} on {host} cannot be used ({reason}; another process may be listening "
                         f"there): give a free port, or leave it unset for one the engine picks")


def given_port(server_args: list[str]) -> int | None:
    """The ``--port`` among a server's extra arguments (``--port 8000`` or ``--port=8000``), if any."""
    for index, arg in enumerate(server_args):
        value = arg.split("=", 1)[1] if arg.startswith("--port=") else (
            server_args[index + 1] if arg == "--port" and index + 1 < len(server_args) else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def port_knob(port: int | None, server_args: list[str]) -> str:
    """The knob that set a started server's port (a ``--port`` in ``server_args`` overrides ``port``)."""
    if given_port(server_args) is not None:
        return "data.engine.init_args.server_args (--port)"
    return "data.engine.init_args.port" if port else "the port the engine picked (taken since; run again)"


def refuse_ports(port: int | None, server_args: list[str]) -> None:
    """Refuse a port a started server could not listen on: ``port`` or a ``--port`` in ``server_args``."""
    if port is not None and not 0 <= port < 65536:
        raise InputError(f"data.engine.init_args.port must be in [0, 65535] (unset or 0: a free port), got {port}")
    chosen = given_port(server_args) or port
    if chosen:
        refuse_taken_port(LOOPBACK, chosen, port_knob(port, server_args))


@dataclass(frozen=True)
class ServerAddress:
    """A server's host, port and optional API key, and how to hand them to the server and to its clients."""

    host: str
    port: int
    api_key: str | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API root, e.g. ``http://127.0.0.1:8000/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def server_args(self) -> list[str]:
        """Command-line arguments for the server (``vllm serve`` spells them ``--host`` and ``--port``)."""
        return ["--host", self.host, "--port", str(self.port)]

    def server_env(self) -> dict[str, str]:
        """Environment for the server process: the API key, if any."""
        return {API_KEY_ENV: self.api_key} if self.api_key else {}

    def headers(self) -> dict[str, str]:
        """HTTP headers a client sends: ``Authorization: Bearer <key>`` when there is a key."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def server_address(host: str = LOOPBACK, port: int | None = None, api_key: str | None = None) -> ServerAddress:
    """Host and port for a server an engine starts: ``127.0.0.1`` and a free port unless given.

    Args:
        host: the interface to listen on; anything but loopback exposes the server to the network and needs
            ``api_key``.
        port: the port; ``None`` or 0 picks a free one.
        api_key: the key clients must present; required off loopback.
    """
    if not is_loopback(host) and not api_key:
        raise InputError(
            f"server host {host!r} is not loopback: the server would accept requests from the network; set an "
            f"api_key (or keep the default host {LOOPBACK})"
        )
    if port is not None and not 0 <= port < 65536:
        raise InputError(f"server port must be in [0, 65535] (unset or 0: a free port), got {port}")
    return ServerAddress(host, free_port(host) if not port else port, api_key)
