"""The token rule over real episodes (issue 48): in every episode of a two-epoch run of the shipped tool task, on the
hf engine and on the in-process vLLM engine, as chains and as trees, each training row's counted tokens are exactly
ids the engine sampled for that row's context (with the engine's log-probs as pi_old), the context carries no loss,
each later turn's context is the earlier turn's context, its sampled ids and the template's tool message, and the
trainer's log-probs agree with the sampler's (fp32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent / "tool_episodes_check.py"


@pytest.mark.slow
@pytest.mark.parametrize("rollout", ["chains", "tree"])
@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_the_tokens_trained_are_the_tokens_sampled(engine, rollout, tmp_path):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    result = subprocess.run([sys.executable, str(CHECK), engine, rollout, str(tmp_path)], capture_output=True,
                            text=True, env=env, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    figures = json.loads(lines[-1][len("FIGURES "):])
    print(engine, rollout, figures)
    rows, turns = figures["rows"], figures["turns_continued"]
    assert rows > 0 and turns > 0 and figures["calls"] > 0  # episodes that called tools and went on
    assert figures["rows_equal_to_a_sample"] == rows and figures["logprobs_the_samplers"] == rows
    assert figures["context_masked"] == rows
    assert figures["context_is_parent_plus_reply"] == turns and figures["reply_is_a_tool_message"] == turns
    assert max(figures["logp_diff_max_per_epoch"]) < 1e-4
