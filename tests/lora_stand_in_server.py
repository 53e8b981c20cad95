"""A stand-in for a ``vllm serve`` with runtime LoRA, for tests of the vllm_server engine's dealing and failover.

Answers ``GET /health``, ``GET /v1/models``, ``POST /v1/load_lora_adapter`` (400 for a name already loaded),
``POST /v1/unload_lora_adapter`` (404 for a name not loaded) and ``POST /v1/completions`` (404 for an adapter not
loaded) like vLLM, with ``VLLM_API_KEY`` checked on ``/v1/*``. Completions are made up and hand-checkable: choice
``j`` of a request with seed ``s`` (0 when greedy) is the tokens ``first_token + (s + j + k) % modulo`` for k = 0 ..
max_tokens - 1, each with log-prob -0.5, finish reason ``length`` (``--first-token 3 --modulo 90`` keeps them inside
the tiny model's vocabulary and off its special tokens), or up to the first of the request's stop ids with finish
reason ``stop``; the answer names the adapter asked for as its ``model``, as vLLM's does. ``GET /stats`` tells what
it was asked: the adapters loaded (``[name, path]``) and unloaded in order, each completion request's prompt as it
arrived (``received``), and the adapter, prompt, n and seed of each one answered rightly (``requests``);
``--stats-file`` keeps a copy of it on disk after every change, readable after the server died.

Faults, counted over the completion requests received: ``--exit-after N`` takes N and dies (``os._exit``, every
open connection cut with no answer) when the next one arrives; ``--error-after N --error-code C`` takes N and then
answers HTTP C to every one; ``--delay`` seconds before each completion answer (requests are served concurrently);
``--malformed KIND`` answers every one with HTTP 200 and the answer ``MALFORMED[KIND]`` makes of the right one;
``--hang-after N`` answers N and then never answers another, nor an adapter load or unload, while ``/health`` stays
up (a stuck engine): the request stays open until the client gives up.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def made_up_choice(index: int, seed: int, max_tokens: int, modulo: int, first_token: int = 0,
                   stop_ids: tuple[int, ...] = ()) -> dict[str, Any]:
    """Choice ``index`` of a request seeded ``seed``: tokens ``first_token + (seed + index + k) % modulo``, up to the
    first stop id."""
    ids = [first_token + (seed + index + k) % modulo for k in range(max_tokens)]
    ends = [k for k, token in enumerate(ids) if token in stop_ids]
    ids = ids[: ends[0] + 1] if ends else ids
    return {"index": index, "token_ids": ids, "finish_reason": "stop" if ends else "length", "text": "",
            "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}


def each_choice(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A malformation that applies ``change`` to every choice of the right answer."""
    def malformed(answer: dict[str, Any]) -> dict[str, Any]:
        for choice in answer["choices"]:
            change(choice)
        return answer
    return malformed


def set_tokens(choice: dict[str, Any], ids: list[int]) -> None:
    """``choice`` with the tokens ``ids``, each named and given a log-prob consistently."""
    choice["token_ids"] = ids
    choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}


def logprobs_of(choice: dict[str, Any]) -> dict[str, Any]:
    return choice["logprobs"]


# what --malformed KIND sends instead of the right answer (a dict: JSON; str and bytes: sent as they are)
MALFORMED: dict[str, Callable[[dict[str, Any]], Any]] = {
    "not-json": lambda answer: json.dumps(answer)[:40],  # cut off mid-way
    "not-utf8": lambda answer: b"\xff\xfe\x00\x9c not text",
    "error-object": lambda answer: {"error": {"message": "made-up: out of memory", "type": "InternalServerError",
                                              "code": 500}},
    "other-model": lambda answer: {**answer, "model": "another-adapter"},
    "no-choices": lambda answer: {"model": answer["model"]},
    "choice-missing": lambda answer: {**answer, "choices": answer["choices"][:-1]},
    "choice-extra": lambda answer: {**answer, "choices": [*answer["choices"], {**answer["choices"][0],
                                                                                "index": len(answer["choices"])}]},
    "index-duplicated": each_choice(lambda choice: choice.update(index=0)),
    "index-out-of-range": each_choice(lambda choice: choice.update(index=choice["index"] + 1)),
    "no-token-ids": each_choice(lambda choice: choice.pop("token_ids")),
    "token-ids-as-strings": each_choice(lambda choice: choice.update(token_ids=[str(t) for t in choice["token_ids"]])),
    "no-logprobs": each_choice(lambda choice: choice.update(logprobs=None)),
    "logprobs-one-short": each_choice(lambda choice: logprobs_of(choice)["token_logprobs"].pop()),
    "one-logprob-for-all": each_choice(lambda choice: logprobs_of(choice).update(token_logprobs=[-0.5])),
    "logprob-positive": each_choice(lambda choice: logprobs_of(choice)["token_logprobs"].__setitem__(0, 0.7)),
    "logprob-nan": each_choice(lambda choice: logprobs_of(choice)["token_logprobs"].__setitem__(0, float("nan"))),
    "token-names-text": each_choice(lambda choice: logprobs_of(choice).update(
        tokens=["▁a"] * len(choice["token_ids"]))),
    "token-names-disagree": each_choice(lambda choice: logprobs_of(choice).update(
        tokens=[f"token_id:{t + 1}" for t in choice["token_ids"]])),
    "token-outside-vocab": each_choice(lambda choice: set_tokens(choice, [1_000_000, *choice["token_ids"][1:]])),
    "token-negative": each_choice(lambda choice: set_tokens(choice, [-1, *choice["token_ids"][1:]])),
    "too-many-tokens": each_choice(lambda choice: set_tokens(choice, [*choice["token_ids"], 3])),
    "finish-unknown": each_choice(lambda choice: choice.update(finish_reason="abort")),
    "empty-length": each_choice(lambda choice: set_tokens(choice, [])),
    "empty-stop": each_choice(lambda choice: (set_tokens(choice, []), choice.update(finish_reason="stop"))),
    "stop-without-stop-id": each_choice(lambda choice: choice.update(finish_reason="stop")),
}


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], options: argparse.Namespace) -> None:
        super().__init__(address, Handler)
        self.options = options
        self.lock = threading.Lock()
        self.adapters: dict[str, str] = {}
        self.stats: dict[str, list] = {"loads": [], "unloads": [], "requests": [], "received": []}
        self.received = 0
        self.stuck = False  # --hang-after reached: nothing but /health is answered any more

    def record(self, kind: str, entry: Any) -> None:
        """Add to the stats (the caller holds ``lock``), and to the stats file if there is one."""
        self.stats[kind].append(entry)
        if self.options.stats_file:
            path = self.options.stats_file
            with open(f"{path}.tmp", "w") as file:
                json.dump(self.stats, file)
            os.replace(f"{path}.tmp", path)  # a reader never sees half a file


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def reply(self, status: int, payload: Any) -> None:
        if isinstance(payload, bytes):
            data = payload
        else:
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self) -> bool:
        key = os.environ.get("VLLM_API_KEY")
        if key is None or not self.path.startswith("/v1/") or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.reply(401, {"error": "unauthorized"})
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if not self.authorised():
            return
        if self.path == "/health":
            self.reply(200, "")
        elif self.path == "/v1/models":
            self.reply(200, {"data": [{"id": name} for name in self.server.adapters]})
        elif self.path == "/stats":
            with self.server.lock:
                self.reply(200, self.server.stats)
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self) -> None:  # noqa: N802
        if not self.authorised():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/load_lora_adapter":
            self.load(body)
        elif self.path == "/v1/unload_lora_adapter":
            self.unload(body)
        elif self.path == "/v1/completions":
            self.complete(body)
        else:
            self.reply(404, {"error": "not found"})

    def hang_if_stuck(self) -> None:
        """Never return once ``--hang-after`` is reached: the connection stays open, nothing is answered."""
        if self.server.stuck:
            threading.Event().wait()

    def load(self, body: dict[str, Any]) -> None:
        self.hang_if_stuck()
        with self.server.lock:
            if body["lora_name"] in self.server.adapters:
                return self.reply(400, {"error": f"The lora adapter '{body['lora_name']}' has already been loaded."})
            self.server.adapters[body["lora_name"]] = body["lora_path"]
            self.server.record("loads", [body["lora_name"], body["lora_path"]])
        self.reply(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    def unload(self, body: dict[str, Any]) -> None:
        self.hang_if_stuck()
        with self.server.lock:
            if self.server.adapters.pop(body["lora_name"], None) is None:
                return self.reply(404, {"error": f"The lora adapter '{body['lora_name']}' cannot be found."})
            self.server.record("unloads", body["lora_name"])
        self.reply(200, f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

    def complete(self, body: dict[str, Any]) -> None:
        server, options = self.server, self.server.options
        with server.lock:
            server.received += 1  # faults count the completion requests received, answered or not
            server.record("received", body["prompt"])
            if options.exit_after is not None and server.received > options.exit_after:
                os._exit(1)  # a crash: this request's connection (and any other open one) is cut without an answer
            failing = options.error_after is not None and server.received > options.error_after
            server.stuck = server.stuck or (options.hang_after is not None and server.received > options.hang_after)
        self.hang_if_stuck()
        if failing:
            return self.reply(options.error_code, {"error": "made-up server failure"})
        if body["model"] not in server.adapters:
            return self.reply(404, {"error": f"The model `{body['model']}` does not exist."})
        time.sleep(options.delay)
        seed = body["seed"] or 0
        choices = [made_up_choice(j, seed, body["max_tokens"], options.modulo, options.first_token,
                                  tuple(body["stop_token_ids"])) for j in range(body["n"])]
        answer: Any = {"model": body["model"], "choices": choices}
        if options.malformed is not None:
            answer = MALFORMED[options.malformed](answer)
        else:
            with server.lock:  # only the right answers count as answered
                server.record("requests", [body["model"], body["prompt"], body["n"], body["seed"]])
        self.reply(200, answer)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--modulo", type=int, default=1000)
    parser.add_argument("--first-token", type=int, default=0)
    parser.add_argument("--stats-file", default=None)
    parser.add_argument("--exit-after", type=int, default=None)
    parser.add_argument("--error-after", type=int, default=None)
    parser.add_argument("--error-code", type=int, default=503)
    parser.add_argument("--hang-after", type=int, default=None)
    parser.add_argument("--malformed", choices=sorted(MALFORMED), default=None)
    options = parser.parse_args()
    StandIn((options.host, options.port), options).serve_forever()


if __name__ == "__main__":
    main()
