"""The command makes torch's idle OpenMP threads sleep (lit_grpo/cli/idle_threads.py): set before torch loads, never
over the user's own setting, and not at all once torch is loaded (where it would change nothing)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lit_grpo.cli.idle_threads import WAIT_POLICY, idle_threads_sleep


def test_sets_passive_when_unset_and_torch_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delitem(sys.modules, "torch")
    assert idle_threads_sleep() is True
    import os

    assert os.environ[WAIT_POLICY] == "PASSIVE"


def test_a_spin_count_of_the_users_wins_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAIT_POLICY, raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    monkeypatch.delitem(sys.modules, "torch")
    assert idle_threads_sleep() is False
    import os

    assert WAIT_POLICY not in os.environ


def test_the_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WAIT_POLICY, "ACTIVE")
    monkeypatch.delitem(sys.modules, "torch")
    assert idle_threads_sleep() is False
    import os

    assert os.environ[WAIT_POLICY] == "ACTIVE"


def test_too_late_once_torch_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import torch  # noqa: F401  (loaded: libgomp has read its policy)

    monkeypatch.delenv(WAIT_POLICY, raising=False)
    assert idle_threads_sleep() is False
    assert WAIT_POLICY not in os.environ


CASES = [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")]


def import_the_command(given: str | None) -> subprocess.Popen:
    """A fresh process that imports ``lit_grpo.cli`` with the policy unset or set to ``given`` and prints the policy
    after the import and the policy as it stood when torch began to load (an import hook's record)."""
    program = ("import os, sys\n"
               f"os.environ.pop({WAIT_POLICY!r}, None)\n"
               + (f"os.environ[{WAIT_POLICY!r}] = {given!r}\n" if given else "")
               + "seen = []\n"
               "class TorchLoading:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               f"        if name == 'torch' and not seen: seen.append(os.environ.get({WAIT_POLICY!r}))\n"
               "sys.meta_path.insert(0, TorchLoading())\n"
               "import lit_grpo.cli\n"
               f"print(os.environ.get({WAIT_POLICY!r}), seen)\n")
    return subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def command_imports() -> dict[str | None, subprocess.Popen]:
    """Both cases' processes, started together: each spends seconds importing torch and Lightning, and on two cores
    they overlap."""
    processes = {given: import_the_command(given) for given, _ in CASES}
    yield processes
    for process in processes.values():
        process.kill()
        process.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("given, expected", CASES)
def test_the_command_sets_it_before_torch_loads(command_imports, given: str | None, expected: str) -> None:
    """``lit_grpo.cli`` (the command's package) sets the policy before its imports load torch: in a fresh process the
    variable is there once the package is imported, and it was there already when torch began to load."""
    process = command_imports[given]
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    assert stdout.split("\n")[-2] == f"{expected} [{expected!r}]"
