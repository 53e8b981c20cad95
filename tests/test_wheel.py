"""A regular (non-editable) install ships every module: build the wheel and import each module from it, outside
the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_holds_and_imports_every_module(tmp_path: Path) -> None:
    sources = sorted(
        p.relative_to(PROJECT_ROOT).as_posix() for folder in ("lit_grpo", "callbacks")
        for p in (PROJECT_ROOT / folder).rglob("*.py")
    )
    # callbacks/x.py installs as lit_grpo/callbacks/x.py
    expected = {s.replace("callbacks/", "lit_grpo/callbacks/", 1) if s.startswith("callbacks/") else s for s in sources}
    # build from a fresh copy: setuptools would also pack whatever a stale build/ folder in the checkout holds
    source = tmp_path / "source"
    shutil.copytree(PROJECT_ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "data", "runs", "lightning_logs", "benchmarks", "docs"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
         "-w", str(tmp_path / "dist")],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = (tmp_path / "dist").glob("lit_grpo-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n for n in archive.namelist() if n.endswith(".py")}
        archive.extractall(site)
    assert shipped == expected
    modules = sorted(n[: -len(".py")].replace("/", ".").removesuffix(".__init__") for n in shipped)
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(site)!r}), (name, module.__file__)\n"
        "print(len(sys.modules))\n"
    )
    # run from an empty directory with only the unpacked wheel on the path: no import can come from the checkout
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
