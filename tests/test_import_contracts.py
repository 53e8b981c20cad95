"""Design §1's folders as import-linter contracts (pyproject.toml's ``[tool.importlinter]``): the code keeps them, and
an import that goes up a layer, joins the two sides or reaches the callbacks from below breaks them.

import-linter finds a package's modules by walking its folder, so ``lint-imports`` runs on a copy of the package laid
out as installed (``callbacks/`` inside ``lit_grpo/``, as setuptools' package-dir puts it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = "the folders import down only (design §1)"


def installed_layout(target: Path) -> Path:
    """``target`` holding ``lit_grpo/`` with ``callbacks/`` as ``lit_grpo/callbacks``, and pyproject.toml."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "lit_grpo", target / "lit_grpo", ignore=skip)
    shutil.copytree(ROOT / "callbacks", target / "lit_grpo" / "callbacks", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """import-linter's ``lint-imports`` command (its console-script entry point) run from ``cwd``."""
    run = ("import sys; from importlib.metadata import entry_points; "
           "(script,) = entry_points(group='console_scripts', name='lint-imports'); "
           "sys.argv = ['lint-imports', '--no-cache', '--no-logo']; sys.exit(script.load()())")
    return subprocess.run([sys.executable, "-c", run], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_code_keeps_every_contract(tmp_path):
    result = lint_imports(installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout and "0 broken" in result.stdout


@pytest.mark.slow  # a second each: lint-imports on a fresh copy
@pytest.mark.parametrize("module, line, broken", [
    ("policy/module.py", "import lit_grpo.rollout.cursor", "lit_grpo.policy is not allowed to import lit_grpo.rollout"),
    ("rollout/scoring.py", "import lit_grpo.policy.sampling_view",
     "lit_grpo.rollout is not allowed to import lit_grpo.policy"),
    ("rollout/scoring.py", "from lit_grpo.callbacks import RolloutMetrics",
     "lit_grpo.rollout is not allowed to import lit_grpo.callbacks"),
    ("buffers/report.py", "import lit_grpo.engines.base", "lit_grpo.buffers is not allowed to import lit_grpo.engines"),
    ("risk/rule.py", "import lit_grpo.rollout.trees", "lit_grpo.risk is not allowed to import lit_grpo.rollout"),
    ("run/seeds.py", "import lit_grpo.tasks.base", "lit_grpo.run is not allowed to import lit_grpo.tasks"),
])
def test_an_import_against_the_layers_breaks_the_contract(tmp_path, module, line, broken):
    result = lint_imports(with_line(installed_layout(tmp_path), module, line))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{LAYERS} BROKEN" in result.stdout and broken in result.stdout


@pytest.mark.slow  # a second: lint-imports on a fresh copy
def test_the_policy_importing_an_engine_breaks_its_contract(tmp_path):
    result = lint_imports(with_line(installed_layout(tmp_path), "policy/logprobs.py", "import lit_grpo.engines.base"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the policy side knows no engine and no task (the rollout side's) BROKEN" in result.stdout
    assert f"{LAYERS} KEPT" in result.stdout  # engines sit below the policy: only this contract says no


def with_line(layout: Path, module: str, line: str) -> Path:
    """``layout`` with ``line`` appended to ``lit_grpo/<module>``."""
    with (layout / "lit_grpo" / module).open("a") as source:
        source.write(f"\n{line}  # against design §1\n")
    return layout


@pytest.mark.slow  # a second: lint-imports on a fresh copy
def test_the_rollout_reaching_into_a_tool_task_breaks_its_contract(tmp_path):
    result = lint_imports(with_line(installed_layout(tmp_path), "rollout/trees.py",
                                    "import lit_grpo.tasks.tool_task"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "tool tasks are met through MultiRoundTask's turns only BROKEN" in result.stdout
    assert f"{LAYERS} KEPT" in result.stdout  # tasks sit below the rollout: only this contract says no
