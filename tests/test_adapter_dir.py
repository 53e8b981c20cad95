"""No run writes outside its run directory, and none writes over an existing adapter directory (issue 34): with
``--trainer.fast_dev_run`` the adapter went into ``./adapter``, over what a user kept there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from reliability_doc import documented

from lit_grpo.run.run_dir import unused_directory

TESTS = Path(__file__).resolve().parent
SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0"]


def files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def lit_grpo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lit_grpo.cli", "fit", *args], cwd=cwd, check=False, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(TESTS)})


def users_adapter(directory: Path) -> dict[str, bytes]:
    """An ``adapter/`` in ``directory`` holding files of the user's (or of another run)."""
    (directory / "adapter").mkdir(parents=True)
    (directory / "adapter" / "adapter_model.safetensors").write_bytes(b"the user's weights")
    (directory / "adapter" / "notes.txt").write_text("keep me\n")
    return files(directory / "adapter")


@pytest.mark.slow
def test_fast_dev_run_writes_into_a_run_directory_of_its_own(tiny_llama_dir, tmp_path):
    kept = users_adapter(tmp_path)
    result = lit_grpo(tmp_path, "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.fast_dev_run", "true",
                      *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert files(tmp_path / "adapter") == kept  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "lightning_logs"]  # nothing else in the cwd
    (run,) = (tmp_path / "lightning_logs").iterdir()
    assert run.name.startswith("run-") and (run / "adapter" / "adapter_model.safetensors").is_file()
    assert f"lit-grpo: no logger; this run writes to lightning_logs/{run.name}" in result.stderr
    documented("`trainer.fast_dev_run: true` in a directory holding an adapter/ of the user's",
               "exit 0; the user's adapter/ untouched; the run's adapter (and checkpoint) under "
               "lightning_logs/run-<time>-<pid>; nothing else in the current directory", "test_adapter_dir.py")


@pytest.mark.slow
def test_a_run_never_writes_over_an_adapter_directory(tiny_llama_dir, tmp_path):
    root = tmp_path / "runs"
    kept = users_adapter(root)  # an earlier run's adapter in the directory this run is given
    result = lit_grpo(tmp_path, "--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
                      "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert files(root / "adapter") == kept
    assert (root / "adapter-1" / "adapter_model.safetensors").is_file()
    assert f"adapter saved to {root / 'adapter-1'}" in result.stderr
    documented("a run whose adapter/ directory holds another run's files (`trainer.logger: false`, a given "
               "`default_root_dir`)", "exit 0; those files untouched; the adapter saved beside them in adapter-1/, "
               "and the log says where", "test_adapter_dir.py")


def test_unused_directory_takes_a_missing_one_else_the_next_free_name(tmp_path):
    assert unused_directory(tmp_path / "a") == tmp_path / "a" and (tmp_path / "a").is_dir()
    (tmp_path / "a-1").mkdir()
    assert unused_directory(tmp_path / "a") == tmp_path / "a-2"  # claimed: the next call gets another
    assert unused_directory(tmp_path / "a") == tmp_path / "a-3"
