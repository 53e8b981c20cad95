"""Safe by default: no unpickling of code from checkpoints or adapters, no remote code without the flag, and an
engine-started server that listens on loopback (with an API key when exposed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from lit_grpo.cli import main
from lit_grpo.cli.config_check import config_problems
from lit_grpo.engines.server_address import LOOPBACK, is_loopback, server_address
from lit_grpo.errors import InputError
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.policy.module import PolicyModule
from support import listening_addresses, remote_code_copy

TESTS = Path(__file__).resolve().parent


class CreatesFile:
    """Unpickling this calls ``open(path, "w")``: the file appears if the loader runs pickled code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_pickled_checkpoint_is_refused_and_its_code_never_runs(tiny_llama_dir, tmp_path, capsys):
    target = tmp_path / "pwned.txt"
    checkpoint = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "epoch": 0, "global_step": 0, "payload": CreatesFile(target)}, checkpoint)
    assert not target.exists()
    args = ["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--model.kl.coef", "0", "--trainer.logger",
            "false", "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path),
            "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
            "--ckpt_path", str(checkpoint)]
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    stderr = capsys.readouterr().err
    assert "lit-grpo: refused to load the checkpoint: it holds pickled objects other than tensors" in stderr
    assert "(WeightsUnpickler error: Unsupported global: GLOBAL io.open was not an allowed global by default)" in stderr
    assert not target.exists()


def test_pickled_init_adapter_is_refused(tiny_llama_dir, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]}))
    target = tmp_path / "pwned.txt"
    torch.save({"payload": CreatesFile(target)}, adapter / "adapter_model.bin")
    with pytest.raises(InputError) as info:
        load_policy(str(tiny_llama_dir), 2, 4, 0.0, "all-linear", init_adapter=str(adapter))
    assert str(info.value) == (
        f"init_adapter: {str(adapter)!r} has no adapter_model.safetensors; adapters are read from safetensors only "
        "(convert a pickled adapter_model.bin you trust with safetensors.torch.save_file)"
    )
    assert not target.exists()


@pytest.fixture
def remote_code_model(tiny_llama_dir, tmp_path) -> Path:
    """The tiny model, but its config maps AutoModelForCausalLM to a module shipped beside it, which would create a
    file when imported."""
    return remote_code_copy(Path(tiny_llama_dir), tmp_path / "remote-code-model", tmp_path / "pwned.txt")


def test_model_asking_for_remote_code_is_refused_without_the_flag(remote_code_model, tmp_path):
    expected = (
        f"{str(remote_code_model)!r} asks to run its own Python code (config.json has an auto_map); it is refused "
        "unless you trust that code and set model.trust_remote_code=true"
    )
    assert config_problems({"model": {"model_name_or_path": str(remote_code_model)}}) == [
        f"model.model_name_or_path: {expected}"
    ]
    with pytest.raises(ValueError, match="set model.trust_remote_code=true"):
        PolicyModule(model_name_or_path=str(remote_code_model))
    with pytest.raises(InputError) as info:
        load_tokenizer(str(remote_code_model))
    assert str(info.value) == expected
    with pytest.raises(InputError, match="set model.trust_remote_code=true"):
        load_policy(str(remote_code_model), 2, 4, 0.0, "all-linear")
    assert not (tmp_path / "pwned.txt").exists()
    # with the flag the check steps aside (the code itself is not run here)
    assert config_problems({"model": {"model_name_or_path": str(remote_code_model), "trust_remote_code": True}}) == []


# --- the address of a server an engine starts ---------------------------------------------------------------------
def start_stand_in(address) -> subprocess.Popen:
    env = {**os.environ, **address.server_env()}
    process = subprocess.Popen([sys.executable, str(TESTS / "stand_in_server.py"), *address.server_args()], env=env)
    for _ in range(200):
        if listening_addresses(address.port):
            return process
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the stand-in server did not start listening")


def get_status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the bound address from Linux's /proc")
def test_engine_server_listens_on_loopback_by_default():
    address = server_address()
    assert (address.host, address.api_key) == (LOOPBACK, None) and address.port > 0
    process = start_stand_in(address)
    try:
        assert listening_addresses(address.port) == ["127.0.0.1"]
        assert get_status(f"{address.base_url}/models", address.headers()) == 200
    finally:
        process.kill()
        process.wait()


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the bound address from Linux's /proc")
def test_exposed_server_needs_and_checks_an_api_key():
    with pytest.raises(ValueError) as info:
        server_address("0.0.0.0")
    assert str(info.value) == (
        "server host '0.0.0.0' is not loopback: the server would accept requests from the network; set an api_key "
        "(or keep the default host 127.0.0.1)"
    )
    address = server_address("0.0.0.0", api_key="s3cret")
    assert address.server_args() == ["--host", "0.0.0.0", "--port", str(address.port)]  # the key is not in argv
    assert address.server_env() == {"VLLM_API_KEY": "s3cret"}
    process = start_stand_in(address)
    try:
        assert listening_addresses(address.port) == ["0.0.0.0"]
        url = f"http://127.0.0.1:{address.port}/v1/models"
        assert get_status(url, {}) == 401
        assert get_status(url, {"Authorization": "Bearer wrong"}) == 401
        assert get_status(url, address.headers()) == 200
    finally:
        process.kill()
        process.wait()


def test_loopback_hosts():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.1.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.0.2.2", "::", "example.com"))
    assert server_address(port=8123).port == 8123
    assert server_address("::1").base_url.startswith("http://[::1]:")
