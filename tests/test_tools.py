"""Tools and environments as TRL 1.16 users write them (issues 48, 57): schemas from the functions themselves, and
every way a call can fail answered to the model, counted, never raised: in TRL's words by default
(``messages="trl"``), as JSON with richer texts under ``messages="json"``, in this process (``timeout=None``) and in
an episode's host process (a timeout)."""

from __future__ import annotations

import json
import time

import pytest

from lit_grpo.errors import InputError
from lit_grpo.tasks.tools.kit import ToolKit
from lit_grpo.tasks.tools.calls import environment_tools, tool_schema


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


def one(kit: ToolKit, bad_call: dict, environment: str | None = None):
    box, _ = kit.open({"prompt": "p"}, environment)
    try:
        (outcome,) = box.call_turn([bad_call])
    finally:
        box.release()
    return outcome


def test_schemas_come_from_type_hints_and_docstrings():
    assert tool_schema(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number."}}, "required": ["a", "b"]},
        "return": {"type": "integer"}}}
    with pytest.raises(InputError, match=r"tool undocumented: .*type hints and a Google-style docstring"):
        tool_schema(undocumented)
    with pytest.raises(InputError, match=r"tool undocumented: "):
        ToolKit([undocumented], None).schemas()


def test_calls_answer_as_tool_messages():
    kit = ToolKit([add, multiply], None, timeout=None)
    assert [s["function"]["name"] for s in kit.schemas()] == ["add", "multiply"]
    box, text = kit.open({"prompt": "p"})
    assert text is None and box.environment is None
    (outcome,) = box.call_turn([call("add", a=2, b=5)])
    assert outcome.message == {"role": "tool", "name": "add", "content": "7"} and outcome.failure is None
    assert outcome.name == "add"
    assert box.call_turn([call("multiply", a=3, b=4)])[0].message["content"] == "12"  # an async tool, awaited
    assert box.call_turn([{"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}])[
        0].message["content"] == "2"  # arguments as JSON text


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
@pytest.mark.parametrize("timeout", [None, 30.0], ids=["in-process", "hosted"])
def test_every_failed_call_is_an_error_message_and_counted_as_json(bad_call, failure, error, timeout):
    kit = ToolKit(TOOLS, None, timeout=timeout, messages="json", check_argument_types=True)
    try:
        outcome = one(kit, bad_call)
    finally:
        kit.close()
    assert outcome.failure == failure
    assert outcome.message["role"] == "tool"
    assert content(outcome)["error"].startswith(error)


@pytest.mark.parametrize("bad_call, failure, error", [
    (call("subtract", a=1, b=2), "unknown", "Tool subtract not found."),
    (call("add", a=1), "arguments", "add() missing 1 required positional argument: 'b'"),
    (call("add", a=1, b=2, c=3), "arguments", "add() got an unexpected keyword argument 'c'"),
    (call("broken", x=1), "raised", "division by zero"),
    (call("quits"), "raised", "3"),
    ({"type": "python", "name": "add"}, "malformed", "Unsupported tool call type: python"),
])
@pytest.mark.parametrize("timeout", [None, 30.0], ids=["in-process", "hosted"])
def test_every_failed_call_is_an_error_message_in_trls_words(bad_call, failure, error, timeout):
    kit = ToolKit(TOOLS, None, timeout=timeout)
    try:
        outcome = one(kit, bad_call)
    finally:
        kit.close()
    assert outcome.failure == failure
    assert outcome.message["content"] == str({"error": error})  # TRL: a Python dict's text


def test_trl_messages_are_str_of_the_result_and_no_type_check():
    kit = ToolKit([add, opaque, maybe], None, timeout=None)
    box, _ = kit.open({"prompt": "p"})
    outcomes = box.call_turn([call("add", a="3", b="4"), call("maybe", a=True), call("opaque")])
    assert [o.message["content"] for o in outcomes[:2]] == ["34", "1"]  # called as given, str() of the result
    assert outcomes[2].failure is None and outcomes[2].message["content"].startswith("<object object at")


def test_a_hung_tool_is_stopped_at_its_timeout_and_the_next_episode_answers():
    kit = ToolKit([sleepy], None, timeout=0.5, messages="json")
    try:
        box, _ = kit.open({"prompt": "p"})
        assert box.call_turn([call("sleepy", seconds=0)])[0].message["content"] == "awake"
        spinning = box.host.process
        (outcome,) = box.call_turn([call("sleepy", seconds=3600)])  # spins: no thread could stop it
        assert (outcome.failure, content(outcome)) == ("timeout", {"error": "timed out after 0.5 s"})
        assert spinning.exitcode == -9 and box.lost  # killed: it holds no core any more
        assert box.call_turn([call("sleepy", seconds=0)])[0].failure == "lost"
        box.release()
        fresh, _ = kit.open({"prompt": "p"})
        assert fresh.call_turn([call("sleepy", seconds=0)])[0].message["content"] == "awake"  # a fresh host
    finally:
        kit.close()
    with pytest.raises(InputError, match="tool timeout must be positive"):
        ToolKit([], None, timeout=0)


@pytest.mark.parametrize("timeout", [None, 30.0], ids=["in-process", "hosted"])
def test_an_environments_state_is_the_episodes_and_rewards_read_it(timeout):
    kit = ToolKit([add], {None: Counter}, timeout=timeout)
    try:
        box, _ = kit.open({"prompt": "p", "start": 1})
        assert box.call_turn([call("increment", by=1)])[0].message["content"] == "2"
        assert box.call_turn([call("increment", by=1)])[0].message["content"] == "3"  # the state the first left
        assert box.environment.value == 3 and box.environment.get_reward() == 1.0
        assert box.call_turn([call("add", a=2, b=5)])[0].message["content"] == "7"
        assert kit.reward_environment_types() == [Counter]
    finally:
        kit.close()


def test_a_long_answer_is_cut_with_a_note_only_when_asked():
    box, _ = ToolKit([chatty], None, timeout=None, max_chars=10).open({"prompt": "p"})
    (outcome,) = box.call_turn([call("chatty", n=1_000_000)])
    assert outcome.failure is None
    assert outcome.message["content"] == "xxxxxxxxxx\n[... 999990 more characters cut: answers are kept to 10]"
    box, _ = ToolKit([chatty], None, timeout=None).open({"prompt": "p"})
    assert len(box.call_turn([call("chatty", n=1_000_000)])[0].message["content"]) == 1_000_000  # TRL: no cut


def test_an_environments_public_methods_are_its_tools():
    counter = Counter()
    assert [tool.__name__ for tool in environment_tools(counter)] == ["increment"]
    kit = ToolKit([add], {None: Counter}, timeout=None)
    assert [s["function"]["name"] for s in kit.schemas()] == ["add", "increment"]
    assert kit.tool_names() == ["add", "increment"]
    with pytest.raises(InputError, match="environment object: needs a reset"):
        ToolKit([], {None: object}, timeout=None).tools()
    with pytest.raises(InputError, match="tool 'add' is given twice"):
        ToolKit([add, add], None)


def maybe(a: int, b: int | None = None) -> int:
    """Adds b when there is one.

    Args:
        a: A number.
        b: Another, or nothing.
    """
    return a + (b or 0)


def test_a_null_for_an_optional_argument_and_an_integral_float_are_taken():
    box, _ = ToolKit([maybe], None, timeout=None, messages="json", check_argument_types=True).open({"prompt": "p"})
    assert box.call_turn([call("maybe", a=2, b=None)])[0].message["content"] == "2"  # Optional: nullable
    assert box.call_turn([call("maybe", a=2.0, b=3)])[0].message["content"] == "5.0"  # 2.0 is an integer to JSON
    assert box.call_turn([call("maybe", a=2.5)])[0].failure == "arguments"
