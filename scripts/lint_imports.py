"""``lint-imports`` from the checkout root, as a maintainer types it: ``.venv/bin/python scripts/lint_imports.py``
(any ``lint-imports`` arguments follow). import-linter finds a package's modules by walking its folder, and in the
checkout ``callbacks/`` sits beside ``lit_grpo/`` (setuptools installs it as ``lit_grpo.callbacks``, pyproject.toml's
package-dir), so a plain ``lint-imports`` here stops at "module lit_grpo.callbacks does not exist". This copies the
package laid out as installed, with pyproject.toml's contracts, into a temporary folder and runs ``lint-imports``
there; its output and exit status are ``lint-imports``' own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def installed_layout(target: Path) -> Path:
    """``target`` holding ``lit_grpo/`` with ``callbacks/`` as ``lit_grpo/callbacks``, and pyproject.toml."""
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "lit_grpo", target / "lit_grpo", ignore=skip)
    shutil.copytree(ROOT / "callbacks", target / "lit_grpo" / "callbacks", ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def lint_imports(cwd: Path, arguments: list[str]) -> subprocess.CompletedProcess:
    """import-linter's ``lint-imports`` console script run in ``cwd`` (this interpreter's, without its cache)."""
    run = ("import sys; from importlib.metadata import entry_points; "
           "(script,) = entry_points(group='console_scripts', name='lint-imports'); "
           f"sys.argv = ['lint-imports', '--no-cache', *{arguments!r}]; sys.exit(script.load()())")
    return subprocess.run([sys.executable, "-c", run], cwd=cwd, capture_output=True, text=True, timeout=300)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lint-imports-") as folder:
        result = lint_imports(installed_layout(Path(folder)), sys.argv[1:])
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
