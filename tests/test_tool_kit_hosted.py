"""ToolKit's hosted environments (issue 57): the proxy rewards read them through, forks made in their host, a
factory that gives another class there, routing by name, and the refusal by name where hosts must be spawned."""

from __future__ import annotations

import asyncio
import os

import pytest

from lit_grpo.errors import InputError
from lit_grpo.tasks.episodes import RowUnavailable
from lit_grpo.tasks.tools.kit import ToolKit
from test_tool_kit import Client, Ordered, call, row


def test_a_lambda_factory_is_refused_by_name_where_hosts_must_be_spawned(monkeypatch):
    import multiprocessing

    import lit_grpo.tasks.tools.kit as tool_kit

    monkeypatch.setattr(tool_kit, "fork_context", lambda: multiprocessing.get_context("spawn"))
    kit = ToolKit([], {None: lambda: Client()}, timeout=1.0)
    with pytest.raises(InputError, match=r"<lambda> cannot be sent to its host process .*module-level"):
        kit.open(row())


def test_the_hosted_proxy_reads_sets_and_calls_in_the_host():
    kit = ToolKit([], {None: Client}, timeout=10.0)
    try:
        box, _ = kit.open(row())
        proxy = box.environment
        proxy.question = "changed"
        box.call_turn([call("send", text="changed")])
        assert proxy.get_reward() == 1.0
        assert asyncio.run(proxy.wait(0))  # an async method, run in the host
        with pytest.raises(TypeError, match="cannot be sent from the environment's host process"):
            proxy.lock  # a lock cannot travel
        with pytest.raises(AttributeError):
            proxy.missing
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            import copy

            copy.deepcopy(proxy)
        processes = [host.process for host in kit.hosts]
    finally:
        kit.close()
    assert processes and all(not process.is_alive() for process in processes)
    kit.close()  # idempotent


def test_routed_environments_do_not_get_the_routing_column_and_boxes_are_not_copied():
    import copy

    seen = []

    class Routed(Ordered):
        def reset(self, **row: object) -> None:
            seen.append(sorted(row))

    kit = ToolKit([], {"a": Routed, "b": Ordered}, timeout=None)
    box, _ = kit.open({"prompt": "p", "environment": "a", "x": 1}, "a")
    assert seen == [["prompt", "x"]]  # TRL: a control field, not passed to reset
    with pytest.raises(TypeError, match="a ToolBox is not copied"):
        copy.deepcopy(box)
    single = ToolKit([], {None: Routed}, timeout=None)
    single.open({"prompt": "p", "environment": "kept"})
    assert seen[-1] == ["environment", "prompt"]  # one environment: the row as given, as TRL


def test_a_hosted_factory_giving_another_class_makes_the_row_unavailable_quietly(capfd):
    here = os.getpid()
    kit = ToolKit([], {None: lambda: Client() if os.getpid() == here else object()}, timeout=10.0)
    try:
        assert kit.tool_names() == ["fail", "hang", "send", "wait"]  # the probe, here: a Client
        with pytest.raises(RowUnavailable, match=r"environment factory .*<lambda>: InputError: environment object: "
                                                 r"needs a reset"):
            kit.open(row())
    finally:
        kit.close()
    assert capfd.readouterr().err == ""


class ForkingClient(Client):
    def fork_environment(self) -> ForkingClient:
        twin = ForkingClient()
        twin.question, twin.sent = self.question, list(self.sent)
        return twin


def test_a_hosted_fork_lives_in_its_parents_host_and_a_timeout_loses_both():
    kit = ToolKit([], {None: ForkingClient}, timeout=0.3)
    try:
        box, _ = kit.open(row())
        box.call_turn([call("send", text="a")])
        twin = box.fork()
        assert twin.environment.sent == ["a"] and twin.host is box.host
        assert twin.call_turn([call("send", text="b")])[0].message["content"] == "sent 2"
        assert box.environment.sent == ["a"]  # its own copy
        assert twin.call_turn([call("hang", spin=False)])[0].failure == "timeout"
        assert twin.lost and box.lost and box.fork() is None
        twin.release()
        box.release()
        assert not kit.hosts and not kit.idle[None]  # the killed host is not pooled
    finally:
        kit.close()
