"""Malformed answers from a vLLM server (issue 34): each is checked against the request (``check_answer``), and a
server that sends one counts as failed, as a refused connection does: the request goes to another server, the bad
one is skipped until the next push probes it, and with none left the run ends with one paragraph naming each
server and what it sent. Stand-in servers on loopback (lora_stand_in_server.py ``--malformed KIND``), then through
the ``lit-grpo`` command."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from failover_check import StandIn
from lora_stand_in_server import MALFORMED
from reliability_doc import documented

from lit_grpo.engines import SamplingSpec, VLLMServerEngine
from lit_grpo.engines.server_answers import (
    check_answer,
    parse_choices,
    policy_vocab_size,
)
from lit_grpo.engines.server_pool import ServersUnavailable

SPEC = SamplingSpec(max_new_tokens=4, temperature=1.0, seed=100, stop_token_ids=(2,))
VOCAB = 100  # the tiny model's; the stand-ins' tokens are 3..92

# each malformed answer the stand-in sends: what it is, and the check it fails as the engine words it (n=2,
# max_tokens=4, the tiny model's vocabulary)
MALFORMATIONS = {
    "not-json": ("JSON cut off mid-way", "an answer that is not JSON"),
    "not-utf8": ("bytes that are not UTF-8", "an answer that is not JSON"),
    "error-object": ("an error object (with HTTP 200)", "an error object with HTTP 200"),
    "other-model": ("the answer for another adapter",
                    "an answer for model 'another-adapter', not the requested 'lit-grpo-"),
    "no-choices": ("no choices", "an answer without a list of choices"),
    "choice-missing": ("one choice fewer than n", "1 choice for n=2"),
    "choice-extra": ("one choice more than n", "3 choices for n=2"),
    "index-duplicated": ("every choice's index 0", "choice indices [0, 0] for n=2, not each of 0..1 once"),
    "index-out-of-range": ("choice indices 1..n", "choice indices [1, 2] for n=2, not each of 0..1 once"),
    "no-token-ids": ("no token_ids", "choice 0 with no list of integer token_ids"),
    "token-ids-as-strings": ("token ids as strings", "choice 0 with no list of integer token_ids"),
    "no-logprobs": ("`logprobs: null`", "choice 0 with no log-probs"),
    "logprobs-one-short": ("a log-prob list one short",
                           "choice 0 with 4 token ids but 3 log-prob(s) and 4 log-prob token(s)"),
    "one-logprob-for-all": ("one log-prob for all the tokens",
                            "choice 0 with 4 token ids but 1 log-prob(s) and 4 log-prob token(s)"),
    "logprob-positive": ("a log-prob of 0.7", "choice 0 with log-prob 0.7 > 0, impossible for a probability"),
    "logprob-nan": ("a NaN log-prob", "choice 0 with log-prob nan, not a finite number"),
    "token-names-text": ("log-prob tokens as text, not `token_id:<id>`",
                         "choice 0 with log-prob token '▁a', not 'token_id:<id>' (return_tokens_as_token_ids)"),
    "token-names-disagree": ("log-prob tokens naming other ids than token_ids",
                             "choice 0 with log-prob tokens that disagree with its token ids at token 0"),
    "token-outside-vocab": ("token id 1000000 (a vocabulary of 100)",
                            "choice 0 with token id 1000000 outside the vocabulary (0..99)"),
    "token-negative": ("token id -1", "choice 0 with token id -1 outside the vocabulary (0..99)"),
    "too-many-tokens": ("max_tokens + 1 tokens", "choice 0 with 5 tokens for max_tokens=4"),
    "finish-unknown": ("finish_reason 'abort'", "choice 0 with finish_reason 'abort', not one of ['stop', 'length']"),
    "empty-length": ("no tokens and finish_reason 'length'", "choice 0 with no tokens and finish_reason 'length'"),
    "empty-stop": ("no tokens and finish_reason 'stop'", "choice 0 with no tokens and finish_reason 'stop'"),
    "stop-without-stop-id": ("finish_reason 'stop' without a stop id", "choice 0 with finish_reason 'stop' but tokens"),
}


def test_every_malformation_the_stand_in_sends_is_named_here():
    assert MALFORMATIONS.keys() == MALFORMED.keys()


# --- the check, on answers built by hand ------------------------------------------------------------------------
def choice(index: int, ids: list, finish: str = "length", logprobs: list | None = None, names: list | None = None):
    return {"index": index, "token_ids": ids, "finish_reason": finish, "text": "",
            "logprobs": {"tokens": names if names is not None else [f"token_id:{t}" for t in ids],
                         "token_logprobs": logprobs if logprobs is not None else [-0.5] * len(ids)}}


def right() -> dict:
    """A right answer to n=2, max_tokens=3, stop id 2, adapter 'policy-1' (choices out of order, as a server may)."""
    return {"model": "policy-1", "choices": [choice(1, [7, 8, 2], "stop", [-0.25, -1e-5, 5e-5]),
                                             choice(0, [5, 6, 9], "length", [-9999.0, -2.0, 0.0])]}


def check(answer) -> str | None:
    return check_answer(answer, n=2, max_tokens=3, vocab_size=VOCAB, stop_token_ids=[2], model="policy-1")


def changed(which: int, /, **fields) -> dict:
    """``right()`` with the ``fields`` of choice ``which`` (its index) changed."""
    answer = right()
    [choice_at] = [each for each in answer["choices"] if each["index"] == which]
    choice_at.update(fields)
    return answer


HAND_BUILT = {
    "the body not JSON": ('{"choices": [{"ind', "an answer that is not JSON (sent: {\"choices\": [{\"ind)"),
    "an empty body": ("", "an answer that is not JSON (sent: '')"),
    "a JSON list": ([1, 2], "an answer that is not a JSON object (sent: [1, 2])"),
    "an error object": ({"object": "error", "message": "boom"}, "an error object with HTTP 200"),
    "another adapter's answer": ({**right(), "model": "policy-0"}, "an answer for model 'policy-0', not the requested"),
    "choices not a list": ({"choices": {"0": {}}}, "an answer without a list of choices"),
    "four choices for n=2": ({"choices": right()["choices"] * 2}, "4 choices for n=2"),
    "an index as text": (changed(0, index="0"), "choice indices [1, '0'] for n=2"),
    "a float token id": (changed(0, token_ids=[5, 6.0, 9]), "choice 0 with no list of integer token_ids"),
    "a bool token id": (changed(0, token_ids=[5, True, 9]), "choice 0 with no list of integer token_ids"),
    "one log-prob for three tokens": (changed(0, logprobs={"tokens": ["token_id:5"] * 3, "token_logprobs": [-1.0]}),
                                      "choice 0 with 3 token ids but 1 log-prob(s) and 3 log-prob token(s)"),
    "a log-prob left null": (changed(0, logprobs={"tokens": ["token_id:5", "token_id:6", "token_id:9"],
                                                  "token_logprobs": [-1.0, None, -1.0]}),
                             "choice 0 with log-prob None, not a finite number"),
    "a log-prob of -inf": (changed(0, logprobs={"tokens": ["token_id:5", "token_id:6", "token_id:9"],
                                                "token_logprobs": [-1.0, -math.inf, -1.0]}),
                           "choice 0 with log-prob -inf, not a finite number"),
    "a log-prob of 2e-4": (changed(0, logprobs={"tokens": ["token_id:5", "token_id:6", "token_id:9"],
                                                "token_logprobs": [-1.0, 2e-4, -1.0]}), "log-prob 0.0002 > 0"),
    "a token name without its id": (changed(0, logprobs={"tokens": ["token_id:5", "token_id:", "token_id:9"],
                                                         "token_logprobs": [-1.0] * 3}),
                                    "choice 0 with log-prob token 'token_id:', not 'token_id:<id>'"),
    "a token name with a superscript digit": (changed(0, logprobs={
        "tokens": ["token_id:5", "token_id:²", "token_id:9"], "token_logprobs": [-1.0] * 3}),
        "choice 0 with log-prob token 'token_id:²', not 'token_id:<id>'"),
    "the vocabulary's size as a token id": (changed(0, token_ids=[5, VOCAB, 9], logprobs={
        "tokens": ["token_id:5", f"token_id:{VOCAB}", "token_id:9"], "token_logprobs": [-1.0] * 3}),
        "choice 0 with token id 100 outside the vocabulary (0..99)"),
    "4 tokens for max_tokens=3": (changed(0, **choice(0, [5, 6, 9, 9])), "choice 0 with 4 tokens for max_tokens=3"),
    "finish_reason null": (changed(0, finish_reason=None), "choice 0 with finish_reason None, not one of"),
    "a stop id before the end": (changed(1, **choice(1, [2, 8, 2], "stop")),
                                 ("choice 1 with finish_reason 'stop' but tokens [2, 8, 2] that do not end at their "
                                  "first stop id ([2])")),
    "'length' after a stop id": (changed(0, **choice(0, [5, 2, 9])),
                                 "choice 0 with finish_reason 'length' but stop id 2 at token 1"),
}


@pytest.mark.parametrize("case", HAND_BUILT)
def test_check_answer_names_what_is_wrong(case):
    answer, problem = HAND_BUILT[case]
    assert problem in check(answer)
    assert "\n" not in check(answer)


def test_check_answer_passes_a_right_answer_and_what_a_server_may_rightly_send():
    assert check(right()) is None  # log-probs -9999 (vLLM's floor), 0.0 and +5e-5 (float noise) included
    shorter = changed(0, **choice(0, [5]))  # 'length' with fewer than max_tokens: capped at the context length
    assert check(shorter) is None
    assert check_answer(right(), n=2) is None  # what the request leaves unsaid is not checked
    first, second = parse_choices(right(), 2)
    assert (first.token_ids, first.logprobs, first.finish_reason) == ((5, 6, 9), (-9999.0, -2.0, 0.0), "length")
    assert (second.token_ids, second.finish_reason) == ((7, 8, 2), "stop")


def test_the_excerpt_of_what_was_sent_stays_short():
    long = changed(0, **choice(0, list(range(3, 90)), "abort"))
    problem = check_answer(long, n=2, vocab_size=VOCAB)
    assert problem.startswith("choice 0 with finish_reason 'abort'") and len(problem) < 320
    assert "[...]" in problem  # the middle of the choice cut


def test_the_vocabulary_comes_from_the_pushed_model():
    assert policy_vocab_size(SimpleNamespace(config=SimpleNamespace(vocab_size=151936))) == 151936
    text = SimpleNamespace(vocab_size=32000)
    assert policy_vocab_size(SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text))) == 32000
    embeddings = SimpleNamespace(num_embeddings=64)
    assert policy_vocab_size(SimpleNamespace(get_input_embeddings=lambda: embeddings)) == 64
    assert policy_vocab_size(SimpleNamespace()) is None  # not checked then


# --- stand-in servers sending each malformed answer -------------------------------------------------------------
class FakePolicy:
    """What ``push_policy`` uses of a PEFT model: the base model's path, its config, ``save_pretrained``."""

    active_adapter = "default"
    config = SimpleNamespace(vocab_size=VOCAB)

    def __init__(self) -> None:
        self.peft_config = {"default": SimpleNamespace(base_model_name_or_path="/models/tiny")}

    def save_pretrained(self, path: str, selected_adapters: list[str]) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text("{}")


@pytest.fixture
def servers(tmp_path):
    started: list[StandIn] = []

    def start(*flags: str, wait: bool = True) -> StandIn:
        started.append(StandIn(tmp_path, *flags, wait=wait))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def engine_on(*stand_ins: StandIn) -> VLLMServerEngine:
    engine = VLLMServerEngine(urls=[server.url for server in stand_ins])
    engine.push_policy(FakePolicy())
    return engine


PROMPTS = [[1, 10 + i, 11 + i] for i in range(4)]


def the_good_servers(index: int, n: int) -> list[tuple[int, ...]]:
    """The stand-in's right completions for request ``index`` (seed 100 + index), by the test's own formula."""
    return [tuple(3 + (100 + index + j + k) % 90 for k in range(SPEC.max_new_tokens)) for j in range(n)]


def gave_up(url: str, kind: str) -> str:
    """How the engine says it gave up the server at ``url`` for sending the ``kind`` of malformed answer."""
    return f"the vLLM server at {url} answered POST /v1/completions with {MALFORMATIONS[kind][1]}"


def as_documented(text: str, url: str) -> str:
    """``text`` without what changes from run to run: the server's address, the adapter's name and the excerpt of
    the answer (of whichever request failed first)."""
    text = re.sub(r" \(sent: .*\)\)\. Restart", " (sent: <excerpt>)). Restart", text.replace(url, "<server>"))
    return re.sub(r"lit-grpo-[0-9a-f]{8}-\d+", "<adapter>", text)


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_answer_counts_as_a_failed_server(servers, kind):
    # both start at once; the good one is slowed so that its requests are in flight while the bad one fails
    bad, good = servers("--malformed", kind, wait=False), servers("--delay", "0.05")
    bad.wait_ready()
    engine = engine_on(bad, good)  # the first request goes to the bad one, the first in the list
    with pytest.warns(RuntimeWarning, match=re.escape(f"vLLM server {bad.url} failed and is skipped until the next "
                                                      f"policy push (1 of 2 left): {gave_up(bad.url, kind)}")):
        answers = engine.generate(PROMPTS, 2, SPEC)
    assert [[c.token_ids for c in group] for group in answers] == [the_good_servers(i, 2) for i in range(4)]
    assert all(c.logprobs == (-0.5,) * 4 and c.finish_reason == "length" for group in answers for c in group)
    received = len(bad.stats()["received"])
    assert received >= 1 and len(good.stats()["requests"]) == 4  # what the bad one was sent, retried on the good one
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0}
    engine.generate(PROMPTS, 2, SPEC)
    assert len(bad.stats()["received"]) == received  # skipped until the next push...
    engine.push_policy(FakePolicy())
    assert engine.metrics == {"servers_alive": 2.0, "requests_hedged": 0.0}  # ...which finds it answering /health again

    alone = engine_on(bad)
    with pytest.warns(RuntimeWarning), pytest.raises(ServersUnavailable) as info:
        alone.generate(PROMPTS[:1], 2, SPEC)  # one request: the message does not depend on which failed first
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"no vLLM server is left to generate rollouts (1 configured: "
                                                      f"{bad.url}: {gave_up(bad.url, kind)}")
    given_up = message.partition("(1 configured: ")[2].partition(" (sent: ")
    assert given_up[2]  # and an excerpt of what it sent
    said = as_documented(given_up[0], bad.url).partition("the vLLM server at <server> ")[2]
    documented(f"a vLLM server answering completions with {MALFORMATIONS[kind][0]}",
               "retried on the other server, whose completions were used; skipped until the next push; alone, no "
               f"server left and the paragraph names it: <server> {said} (sent: <excerpt>)", "test_server_answers.py")


# --- through the command ----------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
SERVER_CONFIG = ROOT / "configs" / "quickstart_server.yaml"
COMMAND_KINDS = ["not-json", "error-object", "choice-missing", "one-logprob-for-all", "token-outside-vocab",
                 "finish-unknown"]


def lit_grpo_fit(cwd: Path, urls: list[str], *args: str) -> subprocess.CompletedProcess:
    """One short ``lit-grpo fit`` of the quickstart on the servers at ``urls``: 2 prompts of 2 completions an
    epoch, no validation."""
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(SERVER_CONFIG),
               "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--trainer.limit_val_batches", "0",
               "--data.engine.init_args.urls", json.dumps(urls), "--data.prompts_per_epoch", "2",
               "--data.group_size", "2", "--data.minibatch_size", "4", *args]
    path = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(command, check=False, cwd=cwd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
@pytest.mark.parametrize("kind", COMMAND_KINDS)
def test_the_command_with_only_a_malformed_server_ends_in_one_paragraph(servers, tmp_path, kind):
    bad = servers("--malformed", kind)
    result = lit_grpo_fit(tmp_path, [bad.url], "--trainer.max_epochs", "1", "--data.max_new_tokens", "4")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    [paragraph] = [line for line in result.stderr.splitlines() if "no vLLM server is left" in line]
    assert paragraph.startswith(f"lit-grpo: no vLLM server is left to generate rollouts (1 configured: {bad.url}: "
                                f"{gave_up(bad.url, kind)}")
    assert paragraph.endswith("Restart the servers (or fix data.engine.init_args.urls). No epoch had ended, so there is "
                              "no checkpoint to resume from: run the same command again.")
    if kind == "one-logprob-for-all":  # the answer that was broadcast into π_old without a word
        documented(f"`lit-grpo fit` whose only vLLM server answers {MALFORMATIONS[kind][0]}",
                   f"exit {result.returncode} in epoch 0, no traceback: {as_documented(paragraph, bad.url)}",
                   "test_server_answers.py")


@pytest.mark.slow
def test_the_command_finishes_its_epochs_on_the_good_server(servers, tmp_path):
    bad, good = servers("--malformed", "one-logprob-for-all"), servers("--delay", "0.2")
    scored_file = tmp_path / "scored.jsonl"
    result = lit_grpo_fit(tmp_path, [bad.url, good.url], "--trainer.max_epochs", "2", "--data.max_new_tokens", "4",
                          "--data.task.class_path", "failover_check.ScoredPromptsTask",
                          "--data.task.init_args.scored_file", str(scored_file))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(bad.stats()["received"]) == 2  # one request in each epoch: given up, then again after the push
    scored = [json.loads(line) for line in scored_file.read_text().splitlines()]
    assert len(scored) == 2 * 2 * 2 and len(good.stats()["requests"]) == 4  # every group, from the good server
    assert all(len(s["completion_ids"]) == 4 for s in scored)
    assert gave_up(bad.url, "one-logprob-for-all") in result.stderr  # the warning names the server and the check
    documented("`lit-grpo fit` with one of two vLLM servers answering one log-prob for all the tokens",
               f"exit {result.returncode}; both epochs' {len(scored)} completions (4 tokens each) from the other "
               "server; the bad one named in a warning with the check it failed, sent one request in each epoch (each "
               "push probes it again)", "test_server_answers.py")
