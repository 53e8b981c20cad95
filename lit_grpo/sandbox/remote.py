"""A sandbox service over HTTP instead of a child process here (docs/guide.md#a-python-sandbox): SandboxFusion's
``POST /run_code`` (``{"code", "language", "run_timeout"}`` in; ``{"status", "message", "run_result": {"status",
"return_code", "stdout", "stderr"}}`` out), which verl's and others' code tools call. Each call is one request; the
service's own isolation is what holds (nothing of this machine's), and the scratch directory is the service's."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping

from lit_grpo.sandbox.limits import Limits
from lit_grpo.sandbox.runner import GRACE, Outcome


def run_remote(url: str, code: str, limits: Limits, headers: Mapping[str, str] | None = None) -> Outcome:
    """POST ``code`` to ``url`` (the service's ``/run_code``); the outcome, never an exception for what the code
    or the service did (a service that is down or answers nonsense is an outcome ``"service"``)."""
    body = json.dumps({"code": code, "language": "python", "run_timeout": limits.wall_seconds}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **dict(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=limits.wall_seconds + GRACE) as response:
            answer = json.loads(response.read(limits.output_bytes * 4 + 65536))
    except (OSError, ValueError) as error:  # refused, timed out, HTTP error status, not JSON
        return Outcome("service", f"could not be run by the sandbox service at {url}: {error}", "")
    return outcome_of(answer, limits)


def outcome_of(answer: object, limits: Limits) -> Outcome:
    """A SandboxFusion answer as an outcome: stdout then stderr, cut at the output cap."""
    run = answer.get("run_result") if isinstance(answer, dict) else None
    if not isinstance(run, dict):
        message = answer.get("message") if isinstance(answer, dict) else answer
        return Outcome("service", f"was not run by the sandbox service: {message}", "")
    text = f"{run.get('stdout') or ''}{run.get('stderr') or ''}"
    output = text.encode()[:limits.output_bytes].decode("utf-8", "replace")
    if run.get("status") == "TimeLimitExceeded":
        return Outcome("timeout", f"ran past its wall time of {limits.wall_seconds:g} s (the service says)", output)
    code = run.get("return_code")
    if code != 0:
        return Outcome("exit", f"exited with status {code} ({run.get('status')}, the service says)", output)
    if len(text.encode()) > limits.output_bytes:
        return Outcome("output", f"wrote more than {limits.output_bytes} bytes of output", output)
    return Outcome("ok", "", output)
