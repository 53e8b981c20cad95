"""Issue 57's new inputs, hostile, through the ``lit-grpo`` command: a factory that raises, a reward that is async and
raises, a tool answer of megabytes with TRL's defaults (no character cut: the whole-conversation budget drops it), a
template without tool support. Each ends in one message or in counted failures, never a traceback, never a run
slower than its timeouts allow."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each runs the command

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def fit(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict[str, float], float]:
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs/tools.yaml"),
               "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
               "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path),
               "--data.prompts_per_epoch", "4", "--data.group_size", "4",
               "--data.val_max_prompts", "2", *extra]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(TESTS)})
    logged: dict[str, float] = {}
    for path in tmp_path.glob("**/metrics.csv"):
        with path.open() as handle:
            for row in csv.DictReader(handle):
                logged.update({k: float(v) for k, v in row.items() if v and not k.startswith("time/")})
    return result, logged, time.perf_counter() - start


def test_a_factory_that_raises_is_one_message(tmp_path):
    result, _, _ = fit(tmp_path, "--data.task.init_args.environment", "faulty_tools.raising_factory")
    assert result.returncode in (1, 2), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "ConnectionError: the sandbox service refused the connection" in result.stderr


def test_an_async_reward_that_raises_is_counted_and_the_run_goes_on(tmp_path):
    result, logged, _ = fit(tmp_path, "--data.task.init_args.rewards", "[faulty_tools.broken_judge]",
                            "--data.task.init_args.environment", "lit_grpo.tasks.tools.arithmetic.Registers")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "broken_judge: TimeoutError: the judge did not answer" in result.stderr  # warned, with its message
    assert logged["rollout/reward_errors"] == 16  # every episode of the epoch (4 prompts x 4)


def test_a_megabyte_answer_under_trls_defaults_is_dropped_by_the_budget(tmp_path):
    result, logged, seconds = fit(tmp_path, "--data.task.init_args.environment", "faulty_tools.ChattyRegisters",
                                  "--data.task.init_args.tool_timeout", "5")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert logged["tools/call_frequency"] > 0 and logged["tools/failure_frequency"] < 1.0  # answered, then dropped
    assert logged["tools/cut_episodes"] > 0  # the episodes whose answer passed max_completion_length ended there


def test_a_template_without_tool_support_is_refused_by_name(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(ROOT / "data" / "tiny-qwen2-tools", model)
    (model / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    result, _, _ = fit(tmp_path, "--model.model_name_or_path", str(model))
    assert result.returncode in (1, 2), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "does not render tools" in result.stderr
