"""ToolKit against hostile tools and environments (issue 57): an environment is a live object (a lock, a client it
opens on first use) that is never pickled or copied unless it asks; each rollout gets its own instance and ``reset``
with the whole row, pooled as TRL pools them; a turn runs in TRL's order (sync calls in call order, then the async
ones awaited together); a hung call is stopped at its timeout with its host killed; a tool's exception of any class is
one counted failure, nothing printed. Each case runs in this process (``timeout=None``) and hosted (a timeout)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from lit_grpo.errors import InputError
from lit_grpo.tasks.episodes import RowUnavailable
from lit_grpo.tasks.tools.kit import ToolKit

MODES = pytest.mark.parametrize("timeout", [None, 10.0], ids=["in-process", "hosted"])


def call(name: str, **arguments: object) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


class Client:
    """A TRL user's environment: a lock, a client opened on the first call (a socket here), ``reset`` reading the
    row's ``prompt``; none of it can be pickled."""

    made = 0

    def __init__(self) -> None:
        Client.made += 1
        self.lock = threading.Lock()
        self.client: socket.socket | None = None

    def reset(self, prompt: list, **row: object) -> str:
        self.question, self.sent = prompt[-1]["content"], []
        return f" (row {row['id']})"

    def send(self, text: str) -> str:
        """Send text over the client.

        Args:
            text: What to send.
        """
        with self.lock:
            if self.client is None:
                self.client, self.peer = socket.socketpair()
            self.client.sendall(text.encode())
            self.sent.append(self.peer.recv(100).decode())
        return f"sent {len(self.sent)}"

    async def wait(self, seconds: float) -> str:
        """Wait, then say when.

        Args:
            seconds: How long.
        """
        start = time.monotonic()
        await asyncio.sleep(seconds)
        return f"{start} {time.monotonic()}"

    async def fail(self) -> str:
        """Fails after a while."""
        await asyncio.sleep(0.01)
        raise LookupError("nothing there")

    def hang(self, spin: bool) -> str:
        """Never answers.

        Args:
            spin: Busy-loop instead of sleeping.
        """
        while spin:
            pass
        time.sleep(3600)
        return "never"

    def get_reward(self) -> float:
        return float(self.sent == [self.question])


def row(i: int = 0, question: str = "hello") -> dict:
    return {"prompt": [{"role": "user", "content": question}], "id": i}


@MODES
def test_an_environment_with_a_lock_and_a_lazy_client_runs_and_rewards_read_its_state(timeout):
    kit = ToolKit([], {None: Client}, timeout=timeout)
    try:
        assert kit.tool_names() == ["fail", "hang", "send", "wait"]
        box, text = kit.open(row(7, "hi"))
        assert text == " (row 7)"
        assert [o.message for o in box.call_turn([call("send", text="hi")])] == [
            {"role": "tool", "name": "send", "content": "sent 1"}]
        environment = box.environment
        assert environment.sent == ["hi"] and environment.question == "hi"  # read from where it lives
        assert environment.get_reward() == 1.0 and isinstance(environment, Client)
        assert kit.reward_environment_types() == [Client]
    finally:
        kit.close()


@MODES
def test_async_calls_are_awaited_together_after_the_sync_ones(timeout):
    kit = ToolKit([], {None: Client}, timeout=timeout)
    try:
        box, _ = kit.open(row())
        calls = [call("wait", seconds=0.3), call("send", text="a"), call("wait", seconds=0.3), call("fail"),
                 call("wait", seconds=0.3), call("send", text="b")]
        started = time.perf_counter()
        outcomes = box.call_turn(calls)
        seconds = time.perf_counter() - started
        assert [o.name for o in outcomes] == ["send", "send", "wait", "wait", "fail", "wait"]  # TRL's order
        assert [o.message["content"] for o in outcomes[:2]] == ["sent 1", "sent 2"]  # sync: in call order
        assert (outcomes[4].failure, outcomes[4].message["content"]) == ("raised", "{'error': 'nothing there'}")
        spans = [tuple(map(float, o.message["content"].split())) for o in outcomes if o.name == "wait"]
        assert max(start for start, _ in spans) < min(end for _, end in spans)  # all three ran at once
        assert seconds < 3 * 0.3  # together: one sleep's time (one after another would take 0.9 s)
    finally:
        kit.close()


@pytest.mark.parametrize("spin", [False, True], ids=["sleep", "busy-loop"])
def test_a_hung_call_answers_its_timeout_kills_its_host_and_loses_the_box(spin):
    kit = ToolKit([], {None: Client}, timeout=0.3)
    try:
        box, _ = kit.open(row())
        pid = box.host.process.pid
        outcomes = box.call_turn([call("send", text="x"), call("hang", spin=spin), call("send", text="y"),
                                  call("wait", seconds=0)])
        assert [o.failure for o in outcomes] == [None, "timeout", "lost", "lost"]
        assert outcomes[1].message["content"] == "{'error': 'timed out after 0.3 s'}"
        assert box.lost and box.host.process is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped: nothing left running
        assert box.call_turn([call("send", text="z")])[0].failure == "lost"
        with pytest.raises(RuntimeError, match="the environment was lost"):
            box.environment.sent
        box.release()
        again, _ = kit.open(row())  # a fresh host replaces it
        assert again.call_turn([call("send", text="z")])[0].message["content"] == "sent 1"
    finally:
        kit.close()


@MODES
def test_a_factory_that_raises_makes_the_row_unavailable(timeout):
    def factory():
        if factory.made:
            raise OSError("sandbox service unreachable")
        factory.made = True
        return Client()

    factory.made = False
    kit = ToolKit([], {None: factory}, timeout=timeout)
    try:
        kit.tools()  # the probe: the first instance (in-process, pooled)
        if timeout is None:
            kit.open(row()) and None  # takes the probe from the pool
        with pytest.raises(RowUnavailable, match=r"environment factory .*factory: OSError: sandbox service"):
            kit.open(row())
    finally:
        kit.close()


@MODES
def test_a_reset_that_raises_makes_the_row_unavailable(timeout):
    kit = ToolKit([], {None: lambda: Client()}, timeout=timeout)  # any callable: a lambda too
    try:
        with pytest.raises(RowUnavailable, match="KeyError: 'id'"):
            kit.open({"prompt": [{"role": "user", "content": "no id"}]})
        assert kit.open(row())[1] == " (row 0)"
    finally:
        kit.close()


class Opaque:
    def reset(self, **row: object) -> None:
        return None

    def thing(self) -> object:
        """Returns an object."""
        return threading.Lock()

    def things(self) -> list:
        """Returns a list of objects."""
        return [threading.Lock()]


@MODES
def test_a_result_neither_text_nor_json(timeout):
    for messages in ("trl", "json"):
        kit = ToolKit([], {None: Opaque}, timeout=timeout, messages=messages)
        try:
            box, _ = kit.open(row())
            thing, things = box.call_turn([call("thing"), call("things")])
        finally:
            kit.close()
        if messages == "trl":  # TRL: str() of it; a list passes through as is (where it can travel)
            assert thing.failure is None and thing.message["content"].startswith("<unlocked _thread.lock")
            assert things.failure == (None if timeout is None else "unreadable")
        else:
            assert (thing.failure, things.failure) == ("unreadable", "unreadable")


class Exits:
    def reset(self, **row: object) -> None:
        return None

    def interrupt(self) -> str:
        """Raises KeyboardInterrupt."""
        raise KeyboardInterrupt

    def exit(self) -> str:
        """Raises SystemExit."""
        raise SystemExit(2)

    def base(self) -> str:
        """Raises a bare BaseException."""
        raise BaseException("odd")

    async def interrupt_async(self) -> str:
        """Raises KeyboardInterrupt from a coroutine."""
        raise KeyboardInterrupt

    def vanish(self) -> str:
        """Ends its process at once."""
        os._exit(3)

    def fine(self) -> str:
        """Answers."""
        return "ok"


@MODES
def test_a_tool_raising_any_base_exception_is_one_quiet_failure(timeout, capfd):
    kit = ToolKit([], {None: Exits}, timeout=timeout)
    try:
        box, _ = kit.open(row())
        names = ["interrupt", "exit", "base", "interrupt_async", "fine"]
        outcomes = box.call_turn([call(name) for name in names])
        assert [(o.name, o.failure) for o in outcomes] == [("interrupt", "raised"), ("exit", "raised"),
                                                             ("base", "raised"), ("fine", None),
                                                             ("interrupt_async", "raised")]
        assert not box.lost
        if timeout is not None:  # os._exit ends the host: the call fails, the box is lost
            assert [o.failure for o in box.call_turn([call("vanish"), call("fine")])] == ["raised", "lost"]
            assert box.lost
    finally:
        kit.close()
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == ""


def test_the_users_ctrl_c_while_a_tool_runs_still_stops_the_run():
    import signal

    def interrupted() -> str:
        """Gets a real SIGINT while it runs."""
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        return "swallowed"

    box, _ = ToolKit([interrupted], None, timeout=None).open(row())
    with pytest.raises(KeyboardInterrupt):
        box.call_turn([call("interrupted")])


def slow_add(a: int, b: int) -> str:
    """Adds slowly, saying when it ran.

    Args:
        a: A number.
        b: Another.
    """
    start = time.monotonic()
    time.sleep(0.2)
    return f"{start} {time.monotonic()}"


class Ordered:
    def reset(self, **row: object) -> None:
        self.log: list[str] = []

    def first(self) -> str:
        """Runs first."""
        time.sleep(0.05)
        self.log.append("first")
        return "1"

    def second(self) -> str:
        """Reads what first wrote."""
        return ",".join(self.log)


@MODES
def test_parallel_sync_runs_functions_side_by_side_and_methods_in_order(timeout):
    kit = ToolKit([slow_add], {None: Ordered}, timeout=timeout, parallel_sync=True)
    try:
        box, _ = kit.open(row())
        outcomes = box.call_turn([call("slow_add", a=1, b=2), call("slow_add", a=1, b=2), call("first"),
                                  call("second")])
        spans = [tuple(map(float, o.message["content"].split())) for o in outcomes[:2]]
        assert max(start for start, _ in spans) < min(end for _, end in spans)  # side by side
        assert [o.message["content"] for o in outcomes[2:]] == ["1", "first"]  # the second read the first's write
    finally:
        kit.close()
    box, _ = ToolKit([slow_add], None, timeout=None).open(row())  # default: one after another, as TRL
    spans = [tuple(map(float, o.message["content"].split())) for o in
             box.call_turn([call("slow_add", a=1, b=2), call("slow_add", a=1, b=2)])]
    assert spans[0][1] <= spans[1][0]


class Forkable(Ordered):
    def fork_environment(self) -> Forkable:
        twin = Forkable()
        twin.log = list(self.log)
        return twin


@MODES
def test_the_pool_constructs_once_and_resets_often_and_forks_only_on_request(timeout):
    made = []

    def factory() -> Forkable:
        made.append(os.getpid())
        return Forkable()

    kit = ToolKit([], {None: factory, "plain": Ordered}, timeout=timeout)
    try:
        box, _ = kit.open(row())
        box.call_turn([call("first")])
        twin = box.fork()
        assert twin is not None and twin.call_turn([call("second")])[0].message["content"] == "first"
        twin.call_turn([call("first")])
        assert box.call_turn([call("second")])[0].message["content"] == "first"  # its own copy
        twin.release()
        box.release()
        hosts = set()
        for i in range(3):  # released: the same instance, reset again with the next row
            again, _ = kit.open(row(i))
            assert again.call_turn([call("second")])[0].message["content"] == ""
            hosts.add(None if again.host is None else again.host.process.pid)
            again.release()
        assert len(hosts) == 1  # hosted: the same host process each time
        plain, _ = kit.open(row(), "plain")
        assert plain.fork() is None  # neither __deepcopy__ nor fork_environment: the caller replays
        with pytest.raises(InputError, match=r"environment 'other', which is not among .*\[None, 'plain'\]"):
            kit.open(row(), "other")
    finally:
        kit.close()
    assert made == [os.getpid()]  # the probe, made here (in-process: pooled and reused; hosted: made in its host)


def test_a_host_the_system_refuses_to_start_makes_the_row_unavailable(monkeypatch):
    """fork failing (EAGAIN: too many processes, or no memory) is the row's failure, named, not a traceback."""
    import lit_grpo.tasks.tools.kit as tool_kit
    from lit_grpo.tasks.episodes import RowUnavailable

    def refused(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(tool_kit, "Host", refused)
    kit = ToolKit([], {None: Client}, timeout=1.0)
    with pytest.raises(RowUnavailable, match="did not start .*Resource temporarily unavailable.*tool_timeout: null"):
        kit.open({"prompt": "q"})
    kit.close()
