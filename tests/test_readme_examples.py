"""The README's examples run as written: its custom reward, prompt file and config are copied out of the README
(not retyped here) and trained for one epoch through the ``lit-grpo`` command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def block_starting(language: str, first_line: str) -> str:
    (block,) = [b for b in readme_blocks(language) if b.startswith(first_line)]
    return block


def test_the_custom_reward_example_trains(tmp_path):
    reward_code = block_starting("python", "# my_package/rewards.py")
    (tmp_path / "my_package").mkdir()
    (tmp_path / "my_package" / "__init__.py").write_text("")
    (tmp_path / "my_package" / "rewards.py").write_text(reward_code)
    (tmp_path / "my_prompts.jsonl").write_text(block_starting("json", '{"prompt"'))
    (tmp_path / "my_run.yaml").write_text(block_starting("yaml", "data:\n  task:\n    class_path: lit_grpo.tasks.JsonlTask"))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", "my_run.yaml", "--trainer.max_epochs", "1",
               "--trainer.default_root_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false",
               "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
               "--data.max_new_tokens", "3"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward mean" in result.stderr  # the epoch's rollouts were scored by MyReward
    assert list((tmp_path / "runs").rglob("last.ckpt"))
