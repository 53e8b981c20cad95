"""Rollouts from an OpenAI-compatible vLLM server: generation on its own GPUs or nodes, training here.

The server is either one the user runs (``url``) or one this engine starts on loopback at the first push. Each push
saves the current LoRA adapter where the server can read it and swaps it in at run time
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
and ``--enable-lora``). Completions come back as token ids with the sampled tokens' log-probs, so nothing is
re-tokenised. Only the standard library talks to the server; vLLM itself runs in the server's process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lit_grpo.engines.base import Completion, SamplingSpec
from lit_grpo.engines.server_address import ServerAddress, server_address


class VLLMServerEngine:
    """Generates through a vLLM server's ``/v1/completions``, sampling from the adapter pushed last.

    Args:
        url: base URL of a running vLLM server (``http://gpu-node:8000``), started by you with
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model> --enable-lora --max-lora-rank R
            --logprobs-mode processed_logprobs``. ``None``: the engine starts one itself on 127.0.0.1 at a free port
            at the first push (and stops it on close), with the knobs below.
        api_key: the server's API key (sent as a bearer token; given to a server the engine starts as
            ``VLLM_API_KEY``). ``None`` reads ``VLLM_API_KEY`` from the environment, if set.
        adapter_dir: where each push saves the adapter; the server must be able to read it (a shared filesystem
            when the server runs on another node). ``None``: a temporary directory, fine for a server on this
            machine.
        server_adapter_dir: ``adapter_dir`` as the server's machine sees it, if mounted elsewhere there.
        kv_cache_gib: KV cache of a server the engine starts, in GiB (RAM on a CPU build).
        max_model_len: the longest prompt + completion a server the engine starts accepts; ``None``: the model's own
            context length (its ``max_position_embeddings``), which a larger value may not exceed.
        dtype: weight dtype of a server the engine starts; float32 on CPU keeps its log-probs equal to the trainer's.
        enforce_eager: start the server without graph compilation (faster start-up).
        max_lora_rank: the largest LoRA rank a server the engine starts accepts.
        seed: base seed of a server the engine starts (each request also gets its own from the sampling spec).
        server_args: extra command-line arguments for a server the engine starts (e.g. ``--tensor-parallel-size``).
        startup_timeout: seconds to wait for a started server to answer ``/health``.
        request_timeout: seconds to wait for one HTTP answer.
        max_parallel_requests: requests in flight at once (one per prompt; the server batches them).
        shared: see ``RolloutEngine.shared``.
    """

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        adapter_dir: str | None = None,
        server_adapter_dir: str | None = None,
        kv_cache_gib: float = 1.0,
        max_model_len: int | None = None,
        dtype: str = "float32",
        enforce_eager: bool = True,
        max_lora_rank: int = 64,
        seed: int = 0,
        server_args: list[str] | None = None,
        startup_timeout: float = 600.0,
        request_timeout: float = 600.0,
        max_parallel_requests: int = 64,
        shared: bool = False,
    ) -> None:
        if max_model_len is not None and max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2 or None, got {max_model_len}")
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, got {kv_cache_gib}")
        if max_parallel_requests < 1:
            raise ValueError(f"max_parallel_requests must be >= 1, got {max_parallel_requests}")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/") if url else None
        self.api_key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY")
        self.adapter_dir, self.server_adapter_dir = adapter_dir, server_adapter_dir
        self.kv_cache_gib, self.max_model_len, self.dtype = kv_cache_gib, max_model_len, dtype
        self.enforce_eager, self.max_lora_rank, self.seed = enforce_eager, max_lora_rank, seed
        self.server_args = list(server_args or [])
        self.startup_timeout, self.request_timeout = startup_timeout, request_timeout
        self.max_parallel_requests, self.shared = max_parallel_requests, shared
        self._server: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._temp_dir: Path | None = None
        self._prefix = f"lit-grpo-{uuid.uuid4().hex[:8]}"  # adapter names unique to this engine on a shared server
        self._adapter: tuple[str, Path] | None = None  # (name on the server, local directory) of the pushed adapter
        self._model_path: str | None = None  # the base model of the pushed policy
        self._pushes = 0

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def push_policy(self, model: Any) -> None:
        base_path = model.peft_config[model.active_adapter].base_model_name_or_path
        if self._model_path is not None and base_path != self._model_path:
            raise ValueError(f"this engine serves {self._model_path!r}, not {base_path!r}: use one engine per model")
        self._model_path = base_path
        if self.url is None or self._server is not None:
            self._start_server(base_path)  # once; afterwards it reports a server that has died since
        elif self._pushes == 0:
            self._request("GET", "/v1/models")  # reachable, and the key is accepted
        self._pushes += 1
        name = f"{self._prefix}-{self._pushes}"
        local = self._local_adapter_dir() / name
        model.save_pretrained(str(local), selected_adapters=[model.active_adapter])
        self._unload()
        served = Path(self.server_adapter_dir) / name if self.server_adapter_dir else local
        self._request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(served)})
        self._adapter = (name, local)

    def close(self) -> None:
        if self._server is not None:
            self._stop_server()
        elif self._adapter is not None and self.url is not None:
            try:
                self._unload()
            except RuntimeError:
                pass  # the server is gone: nothing is left to unload
        self._adapter = None
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def _unload(self) -> None:
        if self._adapter is None:
            return
        name, local = self._adapter
        self._adapter = None
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        shutil.rmtree(local, ignore_errors=True)

    def _local_adapter_dir(self) -> Path:
        if self.adapter_dir is not None:
            Path(self.adapter_dir).mkdir(parents=True, exist_ok=True)
            return Path(self.adapter_dir)
        if self._temp_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="lit-grpo-server-adapters-"))
            weakref.finalize(self, shutil.rmtree, str(self._temp_dir), ignore_errors=True)
        return self._temp_dir

    # --- a server of our own, on loopback ----------------------------------------------------------------------
    def _start_server(self, model_path: str) -> None:
        if self._server is not None:
            if self._server.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self._server.returncode}:\n{self._log_tail()}")
            return
        address = server_address(api_key=self.api_key)  # loopback and a free port: never exposed by default
        command = server_command(model_path, address, self)
        self._log_path = self._local_adapter_dir() / "server.log"
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process setting; the server keeps its own default
        env.update(address.server_env())  # the key goes in the environment, not on the command line
        with open(self._log_path, "wb") as log:  # its own session: stopping it stops its engine processes too
            self._server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        weakref.finalize(self, stop_process, self._server)
        self.url = f"http://{address.host}:{address.port}"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                self.url = None
                raise RuntimeError(
                    f"the vLLM server for {model_path!r} exited with code {self._server.returncode} while starting. "
                    "Check model.model_name_or_path and data.engine.init_args (kv_cache_gib, max_model_len, "
                    f"max_lora_rank). Its last lines:\n{self._log_tail()}"
                )
            if self._healthy():
                return
            time.sleep(0.5)
        self._stop_server()
        raise RuntimeError(f"the vLLM server did not answer /health within {self.startup_timeout:.0f}s "
                           "(data.engine.init_args.startup_timeout)")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _stop_server(self) -> None:
        stop_process(self._server)
        self._server, self.url = None, None

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no server log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    # --- generation --------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if self._adapter is None:
            raise RuntimeError("VLLMServerEngine has no policy: call push_policy(model) first")
        if sampling.allowed_token_ids is not None:
            raise ValueError("VLLMServerEngine does not take per-request token constraints; use the hf engine for them")
        name = self._adapter[0]
        bodies = [completion_request(name, prompt, n, sampling, index) for index, prompt in enumerate(prompts)]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel_requests, max(len(bodies), 1))) as pool:
            answers = list(pool.map(lambda body: self._request("POST", "/v1/completions", body), bodies))
        return [parse_choices(answer, n) for answer in answers]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request; a refusal or an unreachable server becomes a RuntimeError that says which."""
        if self.url is None:
            raise RuntimeError("VLLMServerEngine has no server: call push_policy(model) first")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:2000]
            hint = " (wrong or missing api_key?)" if error.code == 401 else ""
            if error.code == 404 and "lora_adapter" in path:
                hint = " (start the server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora)"
            raise RuntimeError(f"the vLLM server at {self.url} refused {method} {path}: HTTP {error.code}{hint}: "
                               f"{detail}") from error
        except (urllib.error.URLError, OSError) as error:
            cause, server = "", self._server
            if server is not None and server.poll() is not None:
                cause = f"; the server the engine started exited with code {server.returncode}:\n{self._log_tail()}"
            message = f"cannot reach the vLLM server at {self.url} ({method} {path}): {error}{cause}"
            raise RuntimeError(message) from error
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text  # the adapter endpoints answer in plain text


def completion_request(model: str, prompt: list[int], n: int, sampling: SamplingSpec, index: int) -> dict[str, Any]:
    """The ``/v1/completions`` body for one prompt: token ids in and out, the sampled tokens' log-probs, the full
    distribution (top-p 1, top-k off, no penalties, no minimum length: explicit, so the defaults a server takes from
    a model's generation_config.json cannot narrow it; ``ignore_eos``: only the spec's stop ids end a completion),
    and request ``index`` seeded with ``seed + index`` as the in-process engine does."""
    return {
        "model": model,
        "prompt": list(prompt),
        "n": n,
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "min_tokens": 0,
        "ignore_eos": True,
        "seed": None if sampling.seed is None else sampling.seed + index,
        "stop_token_ids": list(sampling.stop_token_ids),
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }


def parse_choices(answer: dict[str, Any], n: int) -> list[Completion]:
    """A ``/v1/completions`` answer as ``n`` Completions, in choice order. Token ids come from ``token_ids`` and
    must agree with the log-prob entries' ``token_id:<id>`` names."""
    choices = sorted(answer["choices"], key=lambda choice: choice["index"])
    if len(choices) != n:
        raise RuntimeError(f"the vLLM server returned {len(choices)} choices for n={n}")
    completions = []
    for choice in choices:
        token_ids = tuple(int(t) for t in choice["token_ids"])
        logprobs = choice["logprobs"]
        named = tuple(int(token.removeprefix("token_id:")) for token in logprobs["tokens"])
        if named != token_ids:
            raise RuntimeError(f"the server's token ids {token_ids} and log-prob tokens {named} disagree")
        finish = "stop" if choice["finish_reason"] == "stop" else "length"
        completions.append(Completion(token_ids, tuple(float(v) for v in logprobs["token_logprobs"]), finish))
    return completions


def server_command(model_path: str, address: ServerAddress, engine: VLLMServerEngine) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` at ``address`` with runtime LoRA and processed log-probs."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_path,
        *address.server_args(),
        "--dtype", engine.dtype,
        "--kv-cache-memory-bytes", str(int(engine.kv_cache_gib * 2**30)),
        "--enable-lora",
        "--max-lora-rank", str(engine.max_lora_rank),
        "--max-loras", "1",
        "--logprobs-mode", "processed_logprobs",
        "--seed", str(engine.seed),
        "--generation-config", "vllm",  # neutral default sampling options, not the checkpoint's
    ]
    if engine.max_model_len is not None:
        command += ["--max-model-len", str(engine.max_model_len)]
    if engine.enforce_eager:
        command.append("--enforce-eager")
    return command + engine.server_args


def stop_process(process: subprocess.Popen | None, grace: float = 30.0) -> None:
    """SIGTERM to the server's process group (it was started in a session of its own), SIGKILL after ``grace``
    seconds."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
