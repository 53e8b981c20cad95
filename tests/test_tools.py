"""Tools and environments as TRL 1.16 users write them (issue 48): schemas from the functions themselves, and every
way a call can fail answered to the model as TRL answers it, counted, never raised."""

from __future__ import annotations

import json
import time

import pytest

from lit_grpo.errors import InputError
from lit_grpo.tasks.tool_worker import ToolWorker
from lit_grpo.tasks.tools import ToolBox, environment_tools, tool_schema


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def broken(x: int) -> int:
    """Always fails.

    Args:
        x: Anything.
    """
    raise ZeroDivisionError("division by zero")


def sleepy(seconds: float) -> str:
    """Sleeps, or spins (a hung tool that keeps a core busy) when asked for more than 10 seconds.

    Args:
        seconds: How long.
    """
    if seconds > 10:
        while True:
            pass
    time.sleep(seconds)
    return "awake"


def chatty(n: int) -> str:
    """Talks a lot.

    Args:
        n: How many characters.
    """
    return "x" * n


def opaque() -> object:
    """Returns an object.
    """
    return object()


def quits() -> str:
    """Exits the process, as a careless tool might.
    """
    raise SystemExit(3)


def undocumented(a, b):
    return a + b


class Counter:
    """An environment: its public methods are tools, its state is the episode's."""

    def reset(self, start: int = 0, **row: object) -> str | None:
        self.value = start
        return None

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much.
        """
        self.value += by
        return self.value

    def get_reward(self) -> float:
        return float(self.value == 3)

    def _private(self) -> None:
        pass


def call(name: str, **arguments: object) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def content(outcome) -> object:
    return json.loads(outcome.message["content"]) if outcome.failure else outcome.message["content"]


def test_schemas_come_from_type_hints_and_docstrings():
    assert tool_schema(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number."}}, "required": ["a", "b"]},
        "return": {"type": "integer"}}}
    with pytest.raises(InputError, match=r"tool undocumented: .*type hints and a Google-style docstring"):
        tool_schema(undocumented)


def test_calls_answer_as_tool_messages():
    box = ToolBox([add, multiply])
    assert [s["function"]["name"] for s in box.schemas()] == ["add", "multiply"]
    outcome = box.call(call("add", a=2, b=5))
    assert outcome.message == {"role": "tool", "name": "add", "content": "7"} and outcome.failure is None
    assert box.call(call("multiply", a=3, b=4)).message["content"] == "12"  # an async tool, run to its end
    assert box.call({"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}).message[
        "content"] == "2"  # arguments as JSON text


TOOLS = [add, broken, sleepy, chatty, opaque, quits]


@pytest.mark.parametrize("bad_call, failure, error", [
    (call("subtract", a=1, b=2), "unknown", "there is no tool 'subtract'; the tools are add, broken, sleepy, chatty, "
                                            "opaque, quits"),
    (call("add", a=1), "arguments", "add: missing a required argument: 'b'"),
    (call("add", a=1, b=2, c=3), "arguments", "add: got an unexpected keyword argument 'c'"),
    (call("add", a="3", b=4), "arguments", "add: argument 'a' must be integer, got \"3\""),
    (call("add", a=True, b=4), "arguments", "add: argument 'a' must be integer, got true"),
    (call("chatty", n=2.5), "arguments", "chatty: argument 'n' must be integer, got 2.5"),
    (call("broken", x=1), "raised", "ZeroDivisionError: division by zero"),
    (call("opaque"), "unreadable", "opaque returned a object, which is neither text nor JSON"),
    (call("quits"), "raised", "SystemExit: 3"),
    ({"type": "function", "function": {"arguments": {}}}, "malformed", "a tool call names no function"),
    ({"type": "function", "function": {"name": "add", "arguments": "{a: 1"}}, "malformed",
     "the arguments of add are not JSON: '{a: 1'"),
])
@pytest.mark.parametrize("in_worker", [False, True], ids=["in-process", "in-worker"])
def test_every_failed_call_is_an_error_message_and_counted(bad_call, failure, error, in_worker):
    worker = ToolWorker({tool.__name__: tool for tool in TOOLS}, timeout=30.0) if in_worker else None
    try:
        outcome = ToolBox(TOOLS, worker=worker).call(bad_call)
    finally:
        if worker is not None:
            worker.close()
    assert outcome.failure == failure
    assert outcome.message["role"] == "tool"
    assert content(outcome)["error"].startswith(error)


def test_a_hung_tool_is_stopped_at_its_timeout_and_the_next_call_answers():
    worker = ToolWorker({"sleepy": sleepy}, timeout=0.5)
    box = ToolBox([sleepy], worker=worker)
    try:
        assert box.call(call("sleepy", seconds=0)).message["content"] == "awake"
        spinning = worker.child.process
        outcome = box.call(call("sleepy", seconds=3600))  # spins: no thread could stop it
        assert (outcome.failure, content(outcome)) == ("timeout", {"error": "timed out after 0.5 s"})
        assert spinning.exitcode == -9 and worker.child.process is None  # killed: it holds no core any more
        assert box.call(call("sleepy", seconds=0)).message["content"] == "awake"  # a fresh child
    finally:
        worker.close()
    with pytest.raises(InputError, match="tool_timeout must be positive"):
        ToolWorker({}, timeout=0)


def test_an_environments_state_comes_back_from_the_worker():
    worker = ToolWorker({"add": add}, timeout=30.0)
    counter = Counter()
    counter.reset(start=1)
    box = ToolBox([add], environment=counter, worker=worker)
    try:
        assert box.call(call("increment", by=1)).message["content"] == "2"
        assert box.call(call("increment", by=1)).message["content"] == "3"  # the state the first call left
        assert box.environment.value == 3 and box.environment.get_reward() == 1.0
        assert box.call(call("add", a=2, b=5)).message["content"] == "7"
        box.environment.unpicklable = lambda: None
        with pytest.raises(InputError, match=r"the environment Counter cannot be sent to the tools' worker process "
                                             r".*set tool_timeout null"):
            box.call(call("increment", by=1))
    finally:
        worker.close()


def test_a_long_answer_is_cut_with_a_note():
    outcome = ToolBox([chatty], max_chars=10).call(call("chatty", n=1_000_000))
    assert outcome.failure is None
    assert outcome.message["content"] == "xxxxxxxxxx\n[... 999990 more characters cut: answers are kept to 10]"


def test_an_environments_public_methods_are_its_tools_and_its_state_the_episodes():
    counter = Counter()
    assert [tool.__name__ for tool in environment_tools(counter)] == ["increment"]
    box = ToolBox([add], environment=counter)
    counter.reset(start=1)
    assert [s["function"]["name"] for s in box.schemas()] == ["add", "increment"]
    assert box.call(call("increment", by=2)).message["content"] == "3"
    assert counter.get_reward() == 1.0
    with pytest.raises(InputError, match="needs a reset"):
        ToolBox([], environment=object())
    with pytest.raises(InputError, match="tool 'add' is given twice"):
        ToolBox([add, add])


def maybe(a: int, b: int | None = None) -> int:
    """Adds b when there is one.

    Args:
        a: A number.
        b: Another, or nothing.
    """
    return a + (b or 0)


def test_a_null_for_an_optional_argument_and_an_integral_float_are_taken():
    box = ToolBox([maybe])
    assert box.call(call("maybe", a=2, b=None)).message["content"] == "2"  # Optional: the schema's nullable
    assert box.call(call("maybe", a=2.0, b=3)).message["content"] == "5.0"  # 2.0 is an integer to JSON Schema
    assert box.call(call("maybe", a=2.5)).failure == "arguments"
