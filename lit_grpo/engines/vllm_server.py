"""Rollouts from OpenAI-compatible vLLM servers: generation on their own GPUs or nodes, training here.

The servers are ones the user runs (``url``, or several as ``urls``: dealing and failover in ``server_pool``) or one
this engine starts on loopback at the first push. Each push saves the current LoRA adapter where the servers can
read it and swaps it in at run time (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``; a server needs
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and ``--enable-lora``). Completions come back as token ids with the sampled
tokens' log-probs, so nothing is re-tokenised. Only the standard library talks to the servers; vLLM itself runs in
their processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lit_grpo.engines.base import Completion, SamplingSpec, engine_dtype
from lit_grpo.engines.hedge import HedgeRule
from lit_grpo.engines.server_address import (
    given_port,
    port_knob,
    refuse_ports,
    refuse_taken_port,
    server_address,
)
from lit_grpo.engines.server_answers import (
    check_answer,
    completion_request,
    parse_choices,
    policy_vocab_size,
)
from lit_grpo.engines.server_process import server_command, stop_process
from lit_grpo.engines.server_pool import (
    Refused,
    Server,
    ServerDown,
    ServerPool,
    decided_by_rank_zero,
    distributed_peers,
    http_json,
)
from lit_grpo.errors import InputError

PROBE_TIMEOUT = 10.0  # seconds a push waits for a server's /health before skipping it until the next push


class VLLMServerEngine:
    """Generates through vLLM servers' ``/v1/completions``, sampling from the adapter pushed last.

    Args:
        url: base URL of one running vLLM server (``http://gpu-node:8000``), started by you with
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve <base model> --enable-lora --max-lora-rank R
            --logprobs-mode processed_logprobs``. ``None`` (and no ``urls``): the engine starts one itself on
            127.0.0.1 at a free port at the first push (and stops it on close), with the knobs below; each DDP rank
            then starts its own.
        urls: several such servers (independent deployments, or the engines of ``vllm serve
            --data-parallel-external-lb``), instead of ``url``. Each adapter version is saved once (by rank 0 under
            DDP) and loaded on every server; each prompt's request (its ``n`` completions) goes to the server with
            the fewest requests in flight (a group never spans servers), seeded by the prompt, not the server. A
            server that fails a request (refused, reset, timed out, HTTP 5xx, a malformed answer:
            ``check_answer``) is skipped until the next push probes it, the request retried on another
            (``rollout/servers_alive``); none left: the run stops naming them and the checkpoint to resume from.
        api_key: the servers' API key (sent as a bearer token; given to a server the engine starts as
            ``VLLM_API_KEY``). ``None`` reads ``VLLM_API_KEY`` from the environment, if set.
        adapter_dir: where each push saves the adapter; every server must be able to read it (a shared filesystem
            when servers run on other nodes). ``None``: a temporary directory, fine for servers on this machine.
        server_adapter_dir: ``adapter_dir`` as the servers' machines see it, if mounted elsewhere there.
        kv_cache_gib: KV cache of a server the engine starts, in GiB (RAM on a CPU build).
        max_model_len: the longest prompt + completion a server the engine starts accepts; ``None``: the model's own
            context length (its ``max_position_embeddings``), which a larger value may not exceed.
        dtype: weight dtype of a server the engine starts; ``auto``: the policy's base dtype (``model.dtype``'s
            choice), which keeps its log-probs equal to the trainer's in float32.
        enforce_eager: start the server without graph compilation (faster start-up).
        max_lora_rank: the largest LoRA rank a server the engine starts accepts.
        seed: base seed of a server the engine starts (each request also gets its own from the sampling spec).
        server_args: extra command-line arguments for a server the engine starts (e.g. ``--tensor-parallel-size``).
        startup_timeout: seconds to wait for a started server to answer ``/health``.
        request_timeout: seconds to wait for one HTTP answer; a server slower than that counts as failed (a push
            probing a down server's ``/health`` waits at most ``PROBE_TIMEOUT``, 10 s). With several servers it is
            the outer bound only: a late request is hedged first (below); with one server it is the only bound.
        hedge_factor: with several servers, a request unanswered after ``hedge_factor`` × the median time per
            token of the run's last 16 answers × its ``max_new_tokens`` (at least ``hedge_min_seconds``) is sent,
            same seed, to another live server too; the first answer is used and the late server skipped until the
            next push, like a failed one (one warning; ``rollout/requests_hedged``). A push leaves out a server
            still loading after ``hedge_factor`` × the slowest other's load. ``None``: wait ``request_timeout``.
        hedge_min_seconds: the shortest hedge deadline: a server is never called late sooner.
        max_parallel_requests: requests in flight at once over all servers (one per prompt; servers batch them).
        shared: see ``RolloutEngine.shared``.
        port: the port of a server the engine starts on 127.0.0.1; ``None``: a free one. A taken port (this one,
            or a ``--port`` in ``server_args``) is refused when the engine is built, before any work.
    """

    samples_from_copy = True  # pushes copy the weights, so it may draw ahead while training goes on

    def __init__(
        self,
        url: str | None = None,
        urls: list[str] | None = None,
        api_key: str | None = None,
        adapter_dir: str | None = None,
        server_adapter_dir: str | None = None,
        kv_cache_gib: float = 1.0,
        max_model_len: int | None = None,
        dtype: str = "auto",
        enforce_eager: bool = True,
        max_lora_rank: int = 64,
        seed: int = 0,
        server_args: list[str] | None = None,
        startup_timeout: float = 600.0,
        request_timeout: float = 600.0,
        hedge_factor: float | None = 4.0,
        hedge_min_seconds: float = 5.0,
        max_parallel_requests: int = 64,
        shared: bool = False,
        port: int | None = None,
    ) -> None:
        if max_model_len is not None and max_model_len < 2:
            raise InputError(f"VLLMServerEngine max_model_len must be >= 2 or None, got {max_model_len}")
        if kv_cache_gib <= 0:
            raise InputError(f"VLLMServerEngine kv_cache_gib must be positive, got {kv_cache_gib}")
        if request_timeout <= 0:
            raise InputError(f"VLLMServerEngine request_timeout must be positive (seconds), got {request_timeout}")
        if hedge_factor is not None and hedge_factor <= 1:
            raise InputError(f"VLLMServerEngine hedge_factor must be > 1 (a multiple of the typical answer time) or "
                             f"null (never hedge), got {hedge_factor}")
        if hedge_min_seconds < 0:
            raise InputError(f"VLLMServerEngine hedge_min_seconds must be >= 0, got {hedge_min_seconds}")
        if max_parallel_requests < 1:
            raise InputError(f"VLLMServerEngine max_parallel_requests must be >= 1, got {max_parallel_requests}")
        self.urls = server_urls(url, urls)  # empty: the engine starts a server of its own
        self.api_key = api_key if api_key is not None else os.environ.get("VLLM_API_KEY")
        self.adapter_dir, self.server_adapter_dir = adapter_dir, server_adapter_dir
        self.kv_cache_gib, self.max_model_len, self.dtype = kv_cache_gib, max_model_len, dtype
        self.enforce_eager, self.max_lora_rank, self.seed = enforce_eager, max_lora_rank, seed
        self.server_args = list(server_args or [])
        self.startup_timeout, self.request_timeout = startup_timeout, request_timeout
        self.hedge_factor, self.hedge_min_seconds = hedge_factor, hedge_min_seconds
        self.max_parallel_requests, self.shared = max_parallel_requests, shared
        self.port = port
        if not self.urls:  # a server of its own: its port must be free now, not after the model has loaded
            refuse_ports(self.port, self.server_args)
        self._server: subprocess.Popen | None = None
        self._log_path: Path | None = None
        self._temp_dir: Path | None = None
        self._pool: ServerPool | None = None
        self._group: Any = None  # the gloo group rank 0 shares each push over (distributed_peers)
        self._prefix = f"lit-grpo-{uuid.uuid4().hex[:8]}"  # adapter names unique to this engine on a shared server
        self._adapter_name: str | None = None  # the pushed adapter's name on the servers (rank 0's under DDP)
        self._saved: Path | None = None  # this process's saved copy of it
        self._model_path: str | None = None  # the base model of the pushed policy
        self._vocab_size: int | None = None  # its vocabulary: a sampled token id outside it is a malformed answer
        self._pushes = 0

    @property
    def url(self) -> str | None:
        """The first server's URL (the started server's once it runs); None before a started server runs."""
        return self.urls[0] if self.urls else self._pool.servers[0].url if self._pool else None

    @property
    def metrics(self) -> dict[str, float]:
        """Figures the DataModule logs as ``rollout/<name>``: the servers live after the last push or request, and
        the requests sent again to another server (hedged) since the last push."""
        if self._pool is None:
            return {}
        return {"servers_alive": float(self._pool.alive_count), "requests_hedged": float(self._pool.hedged)}

    # --- lifecycle ---------------------------------------------------------------------------------------------
    def push_policy(self, model: Any) -> None:
        base_path = model.peft_config[model.active_adapter].base_model_name_or_path
        if self._model_path is not None and base_path != self._model_path:
            raise InputError(f"this engine serves {self._model_path!r}, not {base_path!r}: use one engine per model")
        self._model_path, self._vocab_size = base_path, policy_vocab_size(model)
        if not self.urls:  # a server of this process's own: nobody else loads adapters there
            self._start_server(base_path, engine_dtype(self.dtype, model))  # once; later it reports a dead server
            self._adapter_name = self._load_everywhere(model)
            return
        if self._pool is None:
            self._pool = ServerPool(self.urls, self._http, self._hedge_rule())
        rank, world, self._group = distributed_peers(self._group)
        if world == 1:
            self._adapter_name = self._load_everywhere(model)
            return
        # one save and one load per server for all ranks: rank 0 pushes, the others wait and take its name and its
        # view of which servers answered
        pool = self._pool
        self._adapter_name, alive = decided_by_rank_zero(lambda: (self._load_everywhere(model), pool.alive_urls()),
                                                         rank, self._group)
        pool.set_alive(alive)

    def _load_everywhere(self, model: Any) -> str:
        """Save the adapter under a new name, probe the servers that were down, swap it in on every live one."""
        assert self._pool is not None
        self._pushes += 1
        name = f"{self._prefix}-{self._pushes}"
        local = self._local_adapter_dir() / name
        model.save_pretrained(str(local), selected_adapters=[model.active_adapter])
        served = Path(self.server_adapter_dir) / name if self.server_adapter_dir else local
        self._pool.revive()
        self._pool.on_each(lambda server: self._swap(server, name, str(served)))
        if self._saved is not None:
            shutil.rmtree(self._saved, ignore_errors=True)  # no server will load it again
        self._saved = local
        return name

    def _swap(self, server: Server, name: str, path: str) -> None:
        self._unload(server)
        self._http(server.url, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        server.adapter = name

    def _unload(self, server: Server) -> None:
        name, server.adapter = server.adapter, None
        if name is None:
            return
        try:
            self._http(server.url, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
        except Refused as error:
            if error.code != 404:  # 404: already gone (a server restarted since): nothing to unload
                raise

    def close(self) -> None:
        if self._server is not None:
            self._stop_server()
        elif self._pool is not None:
            for server in self._pool.servers:  # the adapters this process loaded (rank 0's under DDP)
                if not server.alive:
                    continue  # given up: a restarted one holds nothing, a stuck one would hold this for request_timeout
                try:
                    self._unload(server)
                except RuntimeError:
                    pass  # the server is gone: nothing is left to unload
        self._adapter_name = None
        if self._saved is not None:
            shutil.rmtree(self._saved, ignore_errors=True)
            self._saved = None
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None

    def _local_adapter_dir(self) -> Path:
        if self.adapter_dir is not None:
            Path(self.adapter_dir).mkdir(parents=True, exist_ok=True)
            return Path(self.adapter_dir)
        if self._temp_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="lit-grpo-server-adapters-"))
            weakref.finalize(self, shutil.rmtree, str(self._temp_dir), ignore_errors=True)
        return self._temp_dir

    # --- a server of our own, on loopback ----------------------------------------------------------------------
    def _start_server(self, model_path: str, dtype: str) -> None:
        if self._server is not None:
            if self._server.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with code {self._server.returncode}:\n{self._log_tail()}")
            return
        address = server_address(port=self.port, api_key=self.api_key)  # loopback (never exposed by default)
        command = server_command(model_path, address, self, dtype)
        self._log_path = self._local_adapter_dir() / "server.log"
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process setting; the server keeps its own default
        env.update(address.server_env())  # the key goes in the environment, not on the command line
        with open(self._log_path, "wb") as log:  # its own session: stopping it stops its engine processes too
            self._server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        weakref.finalize(self, stop_process, self._server)
        url = f"http://{address.host}:{address.port}"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                if "Address already in use" in self._log_tail():  # taken since it was checked
                    port = given_port(self.server_args) or address.port
                    refuse_taken_port(address.host, port, port_knob(self.port, self.server_args))
                raise RuntimeError(
                    f"the vLLM server for {model_path!r} exited with code {self._server.returncode} while starting. "
                    "Check model.model_name_or_path and data.engine.init_args (kv_cache_gib, max_model_len, "
                    f"max_lora_rank). Its last lines:\n{self._log_tail()}"
                )
            if healthy(url):
                self._pool = ServerPool([url], self._http, self._hedge_rule())
                return
            time.sleep(0.5)
        self._stop_server()
        raise RuntimeError(f"the vLLM server did not answer /health within {self.startup_timeout:.0f}s "
                           "(data.engine.init_args.startup_timeout)")

    def _stop_server(self) -> None:
        stop_process(self._server)
        self._server, self._pool = None, None

    def _log_tail(self, lines: int = 30) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no server log)"
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    # --- generation --------------------------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingSpec) -> list[list[Completion]]:
        if self._adapter_name is None or self._pool is None:
            raise RuntimeError("VLLMServerEngine has no policy: call push_policy(model) first")
        if sampling.allowed_token_ids is not None:
            raise InputError("VLLMServerEngine does not take per-request token constraints (the risk rule's "
                             "forced first tokens); use the hf or vllm engine for them")
        pool, name = self._pool, self._adapter_name
        bodies = [completion_request(name, prompt, n, sampling, index) for index, prompt in enumerate(prompts)]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel_requests, max(len(bodies), 1))) as threads:
            answers = list(threads.map(lambda body: pool.call("POST", "/v1/completions", body, self._checker(body),
                                                              tokens=body["max_tokens"]), bodies))
        return [parse_choices(answer, n) for answer in answers]

    def _hedge_rule(self) -> HedgeRule | None:
        if self.hedge_factor is None:
            return None
        return HedgeRule(self.hedge_factor, self.hedge_min_seconds, self.request_timeout)

    def _checker(self, body: dict[str, Any]) -> Callable[[Any], str | None]:
        """What is wrong with an answer to ``body`` (``check_answer``): a server that sends it counts as failed."""
        return lambda answer: check_answer(answer, body["n"], body["max_tokens"], self._vocab_size,
                                           body["stop_token_ids"], body["model"])

    def _http(self, url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One JSON request to one server (``http_json``); a started server that died says how, with its log."""
        # a live server answers /health at once; a host that went away would hold every push for request_timeout
        timeout = min(self.request_timeout, PROBE_TIMEOUT) if path == "/health" else self.request_timeout
        try:
            return http_json(url, method, path, body, self.api_key, timeout)
        except ServerDown as error:
            server = self._server
            if server is not None and server.poll() is not None:
                raise ServerDown(f"{error}; the server the engine started exited with code {server.returncode}:\n"
                                 f"{self._log_tail()}") from error
            raise


def server_urls(url: str | None, urls: list[str] | None) -> list[str]:
    """The servers an engine was given, checked: ``url`` or ``urls`` (not both), each http(s), none twice."""
    if url is not None and urls is not None:
        raise InputError("give the vllm_server engine url (one server) or urls (several), not both")
    if urls is not None and not urls:
        raise InputError("VLLMServerEngine urls must name at least one server (or leave it unset to start one)")
    given = [url] if url is not None else list(urls or [])
    for each in given:
        if not each.startswith(("http://", "https://")):
            raise InputError(f"VLLMServerEngine url must start with http:// or https://, got {each!r}")
    cleaned = [each.rstrip("/") for each in given]
    if len(set(cleaned)) != len(cleaned):
        raise InputError(f"VLLMServerEngine urls names a server twice: {cleaned}; name each once")
    return cleaned


def healthy(url: str) -> bool:
    """True when the server at ``url`` answers ``/health`` with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False
