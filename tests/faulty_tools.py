"""Environments whose tools fail (tests/test_tool_faults.py names them by import path, as a user would). They are the
shipped ``Registers`` environment with one thing broken, their tools named and documented as its own, so the model
sees the very prompt it was taught on and calls them as it calls those."""

from __future__ import annotations

import socket
import threading
import time

from lit_grpo.tasks.tools.arithmetic import Registers


class FaultyRegisters(Registers):
    """``add`` raises; ``multiply`` hangs, and would then return what is neither text nor JSON."""

    def add(self, x: str, y: str) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        raise RuntimeError("the adder is broken")

    def multiply(self, x: str, y: str) -> str:
        """Multiply two registers and store the product in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        time.sleep(3600)  # past any tool_timeout, and past the test's own limit: waited for, the test fails
        return object()


class ChattyRegisters(Registers):
    """``add`` answers megabytes."""

    def add(self, x: str, y: str) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        return super().add(x, y) * 200_000


class PickyRegisters(Registers):
    """``reset`` raises for a third of the rows (answers divisible by 3), as a user's environment may for rows it
    cannot use."""

    def reset(self, answer: str, operands: list[int], **row: object) -> str:
        if int(answer) % 3 == 0:
            raise LookupError(f"no record for {answer}")
        return super().reset(operands)


class OpaqueRegisters(Registers):
    """``add`` returns what is neither text nor JSON."""

    def add(self, x: str, y: str) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        return object()


class MultiplyOnlyRegisters:
    """The registers with ``multiply`` only: the model's ``add`` calls (every plan has one) name a tool that is not
    there."""

    reset, multiply, _read, _store = Registers.reset, Registers.multiply, Registers._read, Registers._store


class IntegerRegisters(Registers):
    """``add`` declares integer arguments: the model's register names are the wrong type."""

    def add(self, x: int, y: int) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        return super().add(x, y)


class InterruptingRegisters(Registers):
    """``add`` raises ``KeyboardInterrupt``, ``multiply`` ``SystemExit``: the tools' own faults, not the user's Ctrl-C
    (each is one counted failure, and nothing is printed)."""

    def add(self, x: str, y: str) -> str:
        """Add two registers and store the sum in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        raise KeyboardInterrupt

    def multiply(self, x: str, y: str) -> str:
        """Multiply two registers and store the product in a new register.

        Args:
            x: The name of the first register.
            y: The name of the second register.
        """
        raise SystemExit(1)


class ClientRegisters(Registers):
    """A TRL user's environment as they come: it holds a lock and a client it opens on first use (a socket pair here:
    neither can be pickled or deep-copied), and ``reset`` reads the row's ``prompt``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: socket.socket | None = None

    def reset(self, prompt: str | list, operands: list[int], **row: object) -> str:
        self.question = prompt if isinstance(prompt, str) else prompt[-1]["content"]  # text, or a conversation
        return super().reset(operands)

    def _store(self, value: int) -> str:
        with self.lock:
            if self.client is None:
                self.client, self.peer = socket.socketpair()
            self.client.sendall(str(value).encode())  # the register's value goes through the client and back
            return super()._store(int(self.peer.recv(64).decode()))


def raising_factory():
    """TRL's environment_factory as a plain callable that cannot build its environment (a service that is down)."""
    raise ConnectionError("the sandbox service refused the connection")


async def broken_judge(prompts, completions, **kwargs):
    """An async reward (an LLM judge) whose service fails on every call."""
    raise TimeoutError("the judge did not answer")
