"""Several vLLM servers behind one engine (design §12): dealing by requests in flight, failover, re-probing at the
push, ``servers_alive``, one message when none is left, seeds from the prompt; stand-in servers on loopback
(lora_stand_in_server.py), each a process of its own so it can die as a server does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from failover_check import StandIn
from lit_grpo.engines import SamplingSpec, VLLMServerEngine
from lit_grpo.engines.server_address import free_port
from lit_grpo.engines.server_pool import ServersUnavailable

SPEC = SamplingSpec(max_new_tokens=4, temperature=1.0, seed=100)


class FakePolicy:
    """What ``push_policy`` uses of a PEFT model: the base model's path and ``save_pretrained``."""

    active_adapter = "default"

    def __init__(self) -> None:
        self.peft_config = {"default": SimpleNamespace(base_model_name_or_path="/models/tiny")}

    def save_pretrained(self, path: str, selected_adapters: list[str]) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{}")


@pytest.fixture
def servers(tmp_path):
    """``servers(*flags, port=None)`` starts a stand-in; all are stopped at the end."""
    started: list[StandIn] = []

    def start(*flags: str, port: int | None = None) -> StandIn:
        started.append(StandIn(tmp_path, *flags, port=port))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def engine_on(*stand_ins: StandIn, **knobs) -> VLLMServerEngine:
    engine = VLLMServerEngine(urls=[server.url for server in stand_ins], **knobs)
    engine.push_policy(FakePolicy())
    return engine


def prompts(count: int, first: int = 10) -> list[list[int]]:
    return [[1, first + i, first + i + 1] for i in range(count)]


def expected_tokens(index: int, n: int, seed: int = 100) -> list[tuple[int, ...]]:
    """The stand-in's completions for request ``index`` (seed ``seed + index``): the test's own formula."""
    return [tuple(3 + (seed + index + j + k) % 90 for k in range(SPEC.max_new_tokens)) for j in range(n)]


def check_answers(answers, count: int, n: int) -> None:
    assert [[c.token_ids for c in group] for group in answers] == [expected_tokens(i, n) for i in range(count)]


def answered(server: StandIn) -> dict[tuple[int, ...], tuple[str, int, int]]:
    """prompt -> (adapter, n, seed) of every request the server answered."""
    return {tuple(prompt): (adapter, n, seed) for adapter, prompt, n, seed in server.stats()["requests"]}


def test_groups_go_to_the_server_with_fewest_requests_in_flight_and_never_span_servers(servers):
    first, second = servers("--delay", "0.3"), servers("--delay", "0.3")
    engine = engine_on(first, second)
    batch = prompts(8)
    answers = engine.generate(batch, 3, SPEC)
    check_answers(answers, 8, 3)
    by_first, by_second = answered(first), answered(second)
    assert len(by_first) == len(by_second) == 4  # 8 requests at once: 4 in flight on each
    assert not by_first.keys() & by_second.keys()  # each prompt's request went to one server
    assert by_first.keys() | by_second.keys() == {tuple(p) for p in batch}
    assert all(n == 3 for _, n, _ in [*by_first.values(), *by_second.values()])  # the whole group in that request

    # a slow server holds its request while the fast one answers the rest: dealt by load, not in turn
    slow, fast = servers("--delay", "1.0"), servers()
    engine = engine_on(slow, fast, max_parallel_requests=2)
    check_answers(engine.generate(batch, 2, SPEC), 8, 2)
    assert len(answered(slow)) <= 2 and len(answered(fast)) >= 6  # in turn would be 4 and 4


FAULTS = {
    "exits": (["--exit-after", "1"], {}),
    "http-500": (["--error-after", "1", "--error-code", "500"], {}),
    "times-out": (["--delay", "3"], {"request_timeout": 1.0}),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_request_is_retried_on_the_other_server_which_takes_the_rest(servers, fault):
    flags, knobs = FAULTS[fault]
    failing, healthy = servers(*flags), servers("--delay", "0.2")
    engine = engine_on(failing, healthy, **knobs)
    assert engine.metrics == {"servers_alive": 2.0}
    with pytest.warns(RuntimeWarning, match=f"vLLM server {failing.url} failed and is skipped until the next policy "
                                            "push"):
        answers = engine.generate(prompts(6), 2, SPEC)
    check_answers(answers, 6, 2)  # every group, whole, with the seed of its prompt
    lost = [p for p in failing.stats()["received"] if tuple(p) not in answered(failing)]
    assert lost  # the failing server did take requests it never answered...
    retried = answered(healthy)
    assert all(tuple(p) in retried for p in lost)  # ...and each went to the other server
    assert {p: seed for p, (_, _, seed) in retried.items()} == {tuple(p): 100 + i for i, p in enumerate(prompts(6))
                                                                if tuple(p) in retried}
    assert engine.metrics == {"servers_alive": 1.0}
    received = len(failing.stats()["received"])
    check_answers(engine.generate(prompts(6), 2, SPEC), 6, 2)
    assert len(failing.stats()["received"]) == received  # skipped until the next push


def test_a_failed_server_is_skipped_until_a_push_finds_it_answering_again(servers):
    crashing, healthy = servers("--exit-after", "1"), servers()
    engine = engine_on(crashing, healthy)
    with pytest.warns(RuntimeWarning, match="failed and is skipped"):
        engine.generate(prompts(4), 2, SPEC)
    crashing.process.wait(timeout=10)
    with pytest.warns(RuntimeWarning, match=f"vLLM server {crashing.url} does not answer; skipped until the next"):
        engine.push_policy(FakePolicy())  # probed: still down
    assert engine.metrics == {"servers_alive": 1.0}
    restarted = servers(port=crashing.port)  # the same address, a new process without adapters
    check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert restarted.stats()["received"] == []  # up again, but not probed until the next push
    engine.push_policy(FakePolicy())
    assert engine.metrics == {"servers_alive": 2.0}
    version = healthy.stats()["loads"][-1][0]
    assert [name for name, _ in restarted.stats()["loads"]] == [version]  # the push loaded this version there
    check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert {adapter for adapter, _, _ in answered(restarted).values()} == {version}  # and it serves again


def test_a_server_that_restarted_since_the_push_lacks_the_adapter_and_is_skipped(servers):
    restarting, healthy = servers(), servers()
    engine = engine_on(restarting, healthy)
    restarting.stop()
    restarted = servers(port=restarting.port)  # answers /health, but its adapter is gone: HTTP 404
    with pytest.warns(RuntimeWarning, match=r"HTTP 404.*restarted since the last push"):
        check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert restarted.stats()["received"] and not restarted.stats()["requests"]
    assert engine.metrics == {"servers_alive": 1.0}


def test_no_server_left_is_one_message_naming_every_server(servers):
    first, second = servers("--exit-after", "0"), servers("--error-after", "0", "--error-code", "503")
    engine = engine_on(first, second)
    with pytest.warns(RuntimeWarning), pytest.raises(ServersUnavailable) as info:
        engine.generate(prompts(4), 2, SPEC)
    message = str(info.value)
    assert "\n" not in message and message.startswith("no vLLM server is left to generate rollouts (2 configured: ")
    assert f"{first.url}: cannot reach the vLLM server at {first.url} (POST /v1/completions)" in message
    assert f"{second.url}: the vLLM server at {second.url} refused POST /v1/completions: HTTP 503" in message
    # at a push: servers that do not answer /health, one of them never started
    nowhere = f"http://127.0.0.1:{free_port()}"
    engine = VLLMServerEngine(urls=[first.url, nowhere])
    with pytest.warns(RuntimeWarning), pytest.raises(ServersUnavailable) as info:
        engine.push_policy(FakePolicy())
    assert "\n" not in str(info.value)
    for url in (first.url, nowhere):
        assert f"{url}: cannot reach the vLLM server at {url} (GET /health)" in str(info.value)


def test_a_request_seed_comes_from_the_prompt_whichever_server_draws_it(servers):
    first, second = servers(), servers()
    engine = engine_on(first, second)
    batch = prompts(5)
    engine._pool.set_alive([first.url])  # every request to the first server...
    on_first = engine.generate(batch, 3, SPEC)
    engine._pool.set_alive([second.url])  # ...then every one to the second
    on_second = engine.generate(batch, 3, SPEC)
    seeds = [{p: seed for p, (_, _, seed) in answered(server).items()} for server in (first, second)]
    assert seeds[0] == seeds[1] == {tuple(p): 100 + i for i, p in enumerate(batch)}
    assert [[c.token_ids for c in g] for g in on_first] == [[c.token_ids for c in g] for g in on_second]
