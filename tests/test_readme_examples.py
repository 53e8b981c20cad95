"""The README's examples run as written: its custom reward, prompt file and config are copied out of the README
(not retyped here) and trained for one epoch through the ``lit-grpo`` command; its plain-Python quickstart runs as
a script (and, in test_python_api.py, trains the command's adapter)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def block_starting(language: str, first_line: str) -> str:
    (block,) = [b for b in readme_blocks(language) if b.startswith(first_line)]
    return block


@pytest.mark.slow
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
    for noise in ("💡 Tip", "Loading weights", "is deprecated"):  # the log is the run's, not third parties' notices
        assert noise not in result.stderr
    assert list((tmp_path / "runs").rglob("last.ckpt"))


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", *args, "--trainer.max_epochs", "1",
               "--trainer.default_root_dir", str(tmp_path / "runs"), "--trainer.enable_progress_bar", "false"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def package(tmp_path: Path, name: str, first_line: str) -> None:
    (tmp_path / "my_package").mkdir(exist_ok=True)
    (tmp_path / "my_package" / "__init__.py").write_text("")
    (tmp_path / "my_package" / name).write_text(block_starting("python", first_line))


@pytest.mark.slow
def test_the_multi_round_environment_example_trains_as_trees(tmp_path):
    package(tmp_path, "hint_game.py", "# my_package/hint_game.py")
    result = run_cli(tmp_path, "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama-clarify"),
                     "--data.task", "my_package.hint_game.HintGame", "--data.rollout", "tree",
                     "--data.branching", "[2, 2]", "--data.prompts_per_epoch", "4", "--data.minibatch_size", "8",
                     "--data.max_new_tokens", "4", "--data.val_max_prompts", "8", "--trainer.limit_val_batches", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    # the game's held-out episodes were played and its trees grown: asking is among what the shipped model does
    assert re.search(r"epoch 0: 4 prompts, \d+ segments", result.stderr)
    assert "val/return" in result.stderr or "val/reward" in result.stderr


@pytest.mark.slow
def test_the_callback_example_logs_its_metric(tmp_path):
    package(tmp_path, "callbacks.py", "# my_package/callbacks.py")
    (tmp_path / "callbacks.yaml").write_text(block_starting("yaml", "trainer:\n  callbacks:"))
    result = run_cli(tmp_path, "--config", str(ROOT / "configs" / "quickstart.yaml"), "--config", "callbacks.yaml",
                     "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"),
                     "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
                     "--trainer.logger.save_dir", str(tmp_path / "logs"), "--trainer.limit_val_batches", "0",
                     "--data.prompts_per_epoch", "4", "--data.minibatch_size", "32")
    assert result.returncode == 0, result.stderr[-3000:]
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    header, *rows = metrics.read_text().splitlines()
    column = header.split(",").index("rollout/reward_max")
    logged = [float(r.split(",")[column]) for r in rows if r.split(",")[column]]
    assert len(logged) == 1 and 0.0 <= logged[0] <= 1.0  # one epoch, an addition reward


def python_example(save_dir: Path, max_epochs: int, ckpt_path: Path | None = None) -> str:
    """The README's plain-Python quickstart as written, but for ``max_epochs`` epochs, logging under ``save_dir``
    and, given ``ckpt_path``, resumed from that checkpoint (each replaced text must be found exactly once)."""
    code = block_starting("python", "# quickstart.py")
    replacements = [("max_epochs=20", f"max_epochs={max_epochs}"),
                    ('TensorBoardLogger("runs"', f"TensorBoardLogger({str(save_dir)!r}")]
    if ckpt_path is not None:
        fit = "trainer.fit(model, datamodule=data"
        replacements.append((f"{fit})", f"{fit}, ckpt_path={str(ckpt_path)!r})"))
    for old, new in replacements:
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    return code


@pytest.mark.slow
def test_the_python_example_trains_and_reads_its_adapter(tmp_path):
    # from the checkout root, as the README says; the quickstart's whole before-training validation included
    result = subprocess.run([sys.executable, "-c", python_example(tmp_path, max_epochs=1)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "before training: val/reward" in result.stderr and "epoch 0: 32 prompts, 256 segments" in result.stderr
    (version,) = (tmp_path / "quickstart").glob("version_*")
    assert result.stdout.strip().splitlines()[-1] == f"trained adapter in {version / 'adapter'}"
    assert (version / "adapter" / "adapter_model.safetensors").is_file()
