"""Design §1's folders as import-linter contracts (pyproject.toml's ``[tool.importlinter]``): the code keeps them, and
an import that goes up a layer, joins the two sides or reaches the callbacks from below breaks them.

import-linter finds a package's modules by walking its folder, so ``lint-imports`` runs on a copy of the package laid
out as installed (``callbacks/`` inside ``lit_grpo/``, as setuptools' package-dir puts it), as
``scripts/lint_imports.py`` runs it from the checkout root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from lint_imports import installed_layout  # noqa: E402 - the maintainer's wrapper: one copy of the layout
from lint_imports import lint_imports as run_lint_imports  # noqa: E402
LAYERS = "the folders import down only (design §1)"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` run in ``cwd`` as ``scripts/lint_imports.py`` runs it."""
    return run_lint_imports(cwd, ["--no-logo"])


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
                                    "import lit_grpo.tasks.tools.task"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "tool tasks are met through MultiRoundTask's turns only BROKEN" in result.stdout
    assert f"{LAYERS} KEPT" in result.stdout  # tasks sit below the rollout: only this contract says no


@pytest.mark.slow  # a second: lint-imports on a fresh copy
def test_the_wrapper_runs_lint_imports_from_the_checkout_root():
    result = subprocess.run([sys.executable, "scripts/lint_imports.py"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout and "0 broken" in result.stdout


def test_no_loose_module_beside_the_entry_points():
    loose = sorted(p.name for p in (ROOT / "lit_grpo").glob("*.py"))
    assert loose == ["__init__.py", "errors.py"]  # the command is its folder, cli/
