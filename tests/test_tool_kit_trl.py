"""ToolKit's turn against TRL 1.16's own code (issue 57): the same assistant turn's calls go through
``GRPOTrainer._tool_call_loop`` (called on a stand-in trainer that carries only what the loop reads, generating
nothing after the tools) and through ``ToolBox.call_turn``; the tool messages must be equal, content and order, in
this process and hosted, and the failures TRL counts must be those ToolKit marks."""

from __future__ import annotations

import asyncio
import inspect
import threading
from types import SimpleNamespace

import pytest

from lit_grpo.tasks.tools.kit import ToolKit

pytestmark = pytest.mark.slow  # imports TRL's trainer (about 10 s)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def describe(kind: str) -> object:
    """A result of some Python type.

    Args:
        kind: Which.
    """
    return {"bool": True, "dict": {"x": [1, 2.5, None]}, "none": None, "float": 0.1, "list": ["a", 1],
            "text": "plain"}[kind]


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ValueError(f"no {x}")


async def slow_multiply(a: int, b: int) -> int:
    """Multiply two integers, later.

    Args:
        a: The first number.
        b: The second number.
    """
    await asyncio.sleep(0.01)
    return a * b


async def async_broken(x: int) -> int:
    """Fails later.

    Args:
        x: Anything.
    """
    await asyncio.sleep(0)
    raise RuntimeError(f"late {x}")


TOOLS = [add, describe, broken, slow_multiply, async_broken]


def call(name: str, **arguments: object) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


TURN = [call("slow_multiply", a=3, b=4), call("add", a=1, b=2), call("describe", kind="bool"),
        call("async_broken", x=1), call("describe", kind="dict"), call("nope", a=1), call("broken", x=5),
        call("add", a=1), call("slow_multiply", a=1), call("describe", kind="none"), call("describe", kind="float"),
        call("describe", kind="list"), call("add", a="1", b="2"), {"type": "python", "name": "add"},
        call("describe", kind="text")]


def trls_messages(calls: list[dict]) -> tuple[list[dict], int, int]:
    """The tool messages TRL's ``_tool_call_loop`` appends for one assistant turn, and its call and failure counts."""
    from trl.trainer.grpo_trainer import GRPOTrainer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    sync = {t.__name__: t for t in TOOLS if not inspect.iscoroutinefunction(t)}
    awaited = {t.__name__: t for t in TOOLS if inspect.iscoroutinefunction(t)}
    trainer = SimpleNamespace(
        max_tool_calling_iterations=1, _sync_tool_dicts=[sync], _async_tool_dicts=[awaited], async_loop=loop,
        _get_tool_suffix_ids=lambda messages: [0], use_vllm=False, vllm_mode="server", _is_vlm=False,
        model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=10_000)), max_completion_length=1000,
        tools=TOOLS, environment_factories=None, _tokenizer=None,
        _generate_single_turn=lambda ids, *args, **kwargs: ([[] for _ in ids], None))
    prompts = [[{"role": "user", "content": "go"}]]
    completions = [[{"role": "assistant", "content": "", "tool_calls": calls}]]
    try:
        _, completions, _, _, count, failures, _ = GRPOTrainer._tool_call_loop(
            trainer, prompts, [[1, 2]], [[3]], completions, None, None, None)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    return [m for m in completions[0] if m["role"] == "tool"], count, failures


@pytest.mark.parametrize("timeout", [None, 10.0], ids=["in-process", "hosted"])
def test_a_turns_tool_messages_are_trls(timeout):
    expected, count, failures = trls_messages(TURN)
    kit = ToolKit(TOOLS, None, timeout=timeout)
    try:
        box, _ = kit.open({"prompt": "go"})
        outcomes = box.call_turn(TURN)
    finally:
        kit.close()
    assert [o.message for o in outcomes] == expected
    assert len(outcomes) == count
    assert sum(o.failure is not None for o in outcomes) == failures
    assert [o.failure for o in outcomes if o.failure] == ["unknown", "raised", "arguments", "arguments", "malformed",
                                                          "raised"]  # the sync part in call order, then the async
