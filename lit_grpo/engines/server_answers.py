"""A ``/v1/completions`` request (``completion_request``) and its answer checked against it, before any of it is
used (docs/scaling.md#several-vllm-servers).

An answer whose shape does not fit the request (not JSON, an error object, the wrong number of choices, a log-prob
list shorter than its tokens, token ids outside the vocabulary, a finish reason its tokens contradict, ...) would
otherwise end in a traceback, or worse be broadcast into π_old without a word. ``check_answer`` names the first
thing wrong; the engine treats a server that sent it as a failed server (``ServerPool.call``'s ``check``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from lit_grpo.engines.base import Completion, SamplingSpec
from lit_grpo.engines.server_pool import one_line

LOGPROB_SLACK = 1e-4  # a log-prob above this is no log-prob; float noise around 0 is allowed
FINISH_REASONS = ("stop", "length")  # what a request with ignore_eos and stop_token_ids can end with
TOKEN_PREFIX = "token_id:"  # how return_tokens_as_token_ids names a log-prob's token


def excerpt(value: Any, limit: int = 200) -> str:
    """``value`` as it was sent (JSON, or the text itself, control characters escaped), on one line and at most
    about ``limit`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = "".join(char if char.isprintable() or char.isspace() else repr(char)[1:-1] for char in text)
    return one_line(text, limit) if text.strip() else repr(text)


def check_answer(answer: Any, n: int, max_tokens: int | None = None, vocab_size: int | None = None,
                 stop_token_ids: Sequence[int] | None = None, model: str | None = None) -> str | None:
    """What is wrong with ``answer`` as the answer to a request for ``n`` completions of at most ``max_tokens``
    tokens of a ``vocab_size``-token vocabulary, ending at one of ``stop_token_ids``, from adapter ``model``; None
    when nothing is. The problem ends with an excerpt of the part at fault. Unknown request figures (None) are not
    checked. A ``length`` finish with fewer than ``max_tokens`` tokens passes: a server caps ``max_tokens`` at its
    context length."""
    if not isinstance(answer, dict):
        what = "an answer that is not JSON" if isinstance(answer, str) else "an answer that is not a JSON object"
        return f"{what} (sent: {excerpt(answer)})"
    if "error" in answer or answer.get("object") == "error":
        return f"an error object with HTTP 200 (sent: {excerpt(answer)})"
    if model is not None and "model" in answer and answer["model"] != model:
        return f"an answer for model {answer['model']!r}, not the requested {model!r} (sent: {excerpt(answer)})"
    choices = answer.get("choices")
    if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
        return f"an answer without a list of choices (sent: {excerpt(answer)})"
    if len(choices) != n:
        return f"{len(choices)} choice{'' if len(choices) == 1 else 's'} for n={n} (sent: {excerpt(answer)})"
    indices = [choice.get("index") for choice in choices]
    if not all(type(index) is int for index in indices) or sorted(indices) != list(range(n)):
        return f"choice indices {indices} for n={n}, not each of 0..{n - 1} once (sent: {excerpt(answer)})"
    for choice in choices:
        problem = choice_problem(choice, max_tokens, vocab_size, stop_token_ids)
        if problem is not None:
            return f"choice {choice['index']} with {problem} (sent: {excerpt(choice)})"
    return None


def choice_problem(choice: dict[str, Any], max_tokens: int | None, vocab_size: int | None,
                   stop_token_ids: Sequence[int] | None) -> str | None:
    """What is wrong with one choice: its token ids, their log-probs and its finish reason; None when nothing is."""
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(type(token) is int for token in ids):
        return "no list of integer token_ids"
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return "no log-probs"
    values, names = logprobs.get("token_logprobs"), logprobs.get("tokens")
    if not isinstance(values, list) or not isinstance(names, list):
        return "log-probs without the token_logprobs and tokens lists"
    if len(values) != len(ids) or len(names) != len(ids):
        return f"{len(ids)} token ids but {len(values)} log-prob(s) and {len(names)} log-prob token(s)"
    if max_tokens is not None and len(ids) > max_tokens:
        return f"{len(ids)} tokens for max_tokens={max_tokens}"
    outside = [token for token in ids if token < 0 or (vocab_size is not None and token >= vocab_size)]
    if outside:
        vocabulary = f"0..{vocab_size - 1}" if vocab_size is not None else "ids >= 0"
        return f"token id {outside[0]} outside the vocabulary ({vocabulary})"
    problem = logprob_problem(values) or name_problem(names, ids)
    if problem is not None:
        return problem
    return finish_problem(choice.get("finish_reason"), ids, stop_token_ids)


def logprob_problem(values: list[Any]) -> str | None:
    """A log-prob that is not a finite number <= 0 (up to ``LOGPROB_SLACK``), or None."""
    for value in values:
        if type(value) not in (int, float) or not math.isfinite(value):
            return f"log-prob {value!r}, not a finite number"
        if value > LOGPROB_SLACK:
            return f"log-prob {value!r} > 0, impossible for a probability"
    return None


def name_problem(names: list[Any], ids: list[int]) -> str | None:
    """A log-prob token not named ``token_id:<id>``, or one naming another id than ``token_ids`` does; or None."""
    for position, (name, token) in enumerate(zip(names, ids)):
        digits = name.removeprefix(TOKEN_PREFIX) if isinstance(name, str) else ""
        if not (isinstance(name, str) and name.startswith(TOKEN_PREFIX) and digits.isascii() and digits.isdigit()):
            return f"log-prob token {name!r}, not '{TOKEN_PREFIX}<id>' (return_tokens_as_token_ids)"
        if int(digits) != token:
            return f"log-prob tokens that disagree with its token ids at token {position} ({name!r} for {token})"
    return None


def finish_problem(finish: Any, ids: list[int], stop_token_ids: Sequence[int] | None) -> str | None:
    """A finish reason that is not ``stop`` or ``length``, or one its tokens contradict; or None. The request ignores
    EOS, so a ``stop`` ends on one of its stop ids (kept in the ids), the first one sampled; a ``length`` has at
    least one token (max_tokens >= 1) and no stop id."""
    if finish not in FINISH_REASONS:
        return f"finish_reason {finish!r}, not one of {list(FINISH_REASONS)}"
    if not ids:
        return f"no tokens and finish_reason {finish!r}"
    if stop_token_ids is None:
        return None
    stop_ids = set(stop_token_ids)
    stops = [position for position, token in enumerate(ids) if token in stop_ids]
    if finish == "stop" and stops != [len(ids) - 1]:
        return f"finish_reason 'stop' but tokens {ids} that do not end at their first stop id ({list(stop_token_ids)})"
    if finish == "length" and stops:
        return f"finish_reason 'length' but stop id {ids[stops[0]]} at token {stops[0]}, where it should have stopped"
    return None


def parse_choices(answer: dict[str, Any], n: int) -> list[Completion]:
    """A ``/v1/completions`` answer as ``n`` Completions, in choice order, its shape checked (``check_answer`` with
    ``n`` alone; the engine checks the rest of the request before)."""
    problem = check_answer(answer, n)
    if problem is not None:
        raise RuntimeError(f"the vLLM server returned {problem}")
    completions = []
    for choice in sorted(answer["choices"], key=lambda choice: choice["index"]):
        values = tuple(float(value) for value in choice["logprobs"]["token_logprobs"])
        completions.append(Completion(tuple(choice["token_ids"]), values, choice["finish_reason"]))
    return completions


def policy_vocab_size(model: Any) -> int | None:
    """How many token ids ``model`` can sample (its config's ``vocab_size``, what vLLM samples over; else its input
    embeddings' rows); None when it does not say, and the vocabulary is then not checked."""
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text_config, "vocab_size", None)
    if isinstance(size, int) and size > 0:
        return size
    try:
        rows = model.get_input_embeddings().num_embeddings
    except (AttributeError, NotImplementedError):
        return None
    return rows if isinstance(rows, int) and rows > 0 else None


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
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
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
