"""Ctrl-C before the trainer runs (the libraries loading, the configuration parsed, the classes built): one line,
exit code 130, nothing to save. Ctrl-C during a run is Lightning's (the adapter saved, the resume command printed,
exit code 1: tests/test_run_dir.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from reliability_doc import documented

from lit_grpo import cli
from lit_grpo.run.exit_codes import SIGTERM_EXIT
from lit_grpo.run.signals import Terminated

ROOT = Path(__file__).resolve().parents[1]
ONE_LINE = ("lit-grpo: interrupted (Ctrl-C) before training began; nothing was written, so nothing to save or resume "
            "from: run the command again\n")


def test_ctrl_c_while_the_configuration_is_parsed_is_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(self, parser, args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.LitGRPOCLI, "parse_arguments", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main(["fit"])
    assert info.value.code == 130
    assert capsys.readouterr().err == ONE_LINE


def test_sigterm_while_the_configuration_is_parsed_stays_sigterms(monkeypatch, capsys):
    def terminated(self, parser, args) -> None:
        raise Terminated("received signal 15 (SIGTERM)")

    monkeypatch.setattr(cli.LitGRPOCLI, "parse_arguments", terminated)
    with pytest.raises(SystemExit) as info:
        cli.main(["fit"])
    assert info.value.code == SIGTERM_EXIT
    assert "stopped by SIGTERM before training began" in capsys.readouterr().err


# a program prefix: the import of Lightning is interrupted, as a Ctrl-C in the first seconds would
INTERRUPTED_LIGHTNING_IMPORT = """
import sys
class Interrupts:
    def find_spec(self, name, path=None, target=None):
        if name == "lightning":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupts())
"""


def test_ctrl_c_while_the_command_loads_its_libraries_is_one_line_and_exit_130():
    # the Ctrl-C arrives as Lightning is imported, the command's first seconds (as the console script runs it)
    code = INTERRUPTED_LIGHTNING_IMPORT + """sys.argv = ["lit-grpo", "fit"]
from lit_grpo.cli import main
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (130, ONE_LINE)
    documented("Ctrl-C (SIGINT) before training (libraries loading, config parsed)",
               f"exit {result.returncode}; one line: nothing was written, nothing to save or resume from",
               "test_ctrl_c.py")


def test_an_interrupted_import_from_python_stays_an_interrupted_import():
    code = INTERRUPTED_LIGHTNING_IMPORT + """try:
    import lit_grpo.cli
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (0, "KeyboardInterrupt\n")
