"""The benchmarks' timed child process (benchmarks/timed_child.py): each child's own peak RSS, its output and RESULT
line, a timeout that stops it, and the checkout on a child's path."""

import json
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.timed_child import (  # noqa: E402
    fit_command, held_out_accuracies, run_child, with_checkout_on_path)

PRINT_AND_HOLD = """
import json, sys
block = bytearray({mib} * 2**20)  # touched: resident
print("before"); print("RESULT " + json.dumps({{"mib": {mib}}})); print("to stderr", file=sys.stderr)
"""
# a light measuring parent, as a benchmark is (this test process is heavy: a child's peak is at least its parent's
# resident set at the start, benchmarks/timed_child.py's docstring)
LIGHT_PARENT = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from benchmarks.timed_child import run_child
runs = [run_child([sys.executable, "-c", {PRINT_AND_HOLD!r}.format(mib=mib)]) for mib in (200, 20)]
print(json.dumps([[r.returncode, r.peak_rss_bytes, r.result(), r.stdout, r.stderr, r.last_line(), r.seconds]
                  for r in runs]))
"""


def test_each_child_reports_its_own_peak_not_the_largest_so_far():
    parent = run_child([sys.executable, "-c", LIGHT_PARENT])
    assert parent.returncode == 0, parent.stderr
    big, small = json.loads(parent.stdout)
    assert big[0] == 0 and small[0] == 0
    assert big[1] > 200 * 2**20
    assert small[1] < 150 * 2**20  # a RUSAGE_CHILDREN reading would still say > 200 MiB here
    assert big[2] == {"mib": 200} and small[2] == {"mib": 20}
    assert big[3].startswith("before") and big[4] == "to stderr\n"
    assert big[5] == "to stderr" and big[6] > 0


def test_merged_output_keeps_the_order_and_leaves_stderr_empty():
    done = run_child([sys.executable, "-c", "import sys; print('out', flush=True); print('err', file=sys.stderr)"],
                     merge_stderr=True)
    assert done.stdout == "out\nerr\n" and done.stderr == ""


@pytest.mark.slow  # waits out a 1 s timeout
def test_a_child_past_its_timeout_is_stopped_with_its_own_children():
    sleeper = ("import subprocess, sys, time; "
               "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
               "print(g.pid, flush=True); time.sleep(60)")
    done = run_child([sys.executable, "-c", sleeper], timeout=1.0)
    assert done.timed_out and done.returncode is None
    assert done.seconds < 30
    grandchild = int(done.stdout)
    for _ in range(100):  # killed with its group; init reaps it
        try:
            if "zombie" in Path(f"/proc/{grandchild}/status").read_text():
                break
        except FileNotFoundError:
            break
        time.sleep(0.02)
    else:
        pytest.fail(f"the grandchild {grandchild} outlived the timeout")
    with pytest.raises(SystemExit, match="was stopped at its timeout"):
        done.checked("the sleeper")


def test_a_failed_child_stops_the_benchmark_with_the_end_of_its_output():
    done = run_child([sys.executable, "-c", "import sys; print('why it failed', file=sys.stderr); sys.exit(3)"])
    assert done.returncode == 3 and done.result() is None
    with pytest.raises(SystemExit, match=r"(?s)the run failed \(exit 3\):\nwhy it failed"):
        done.checked("the run")


def test_a_child_in_another_directory_imports_the_benchmarks_from_this_checkout(tmp_path):
    env = with_checkout_on_path({"PATH": os.environ["PATH"], "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == f"{ROOT}{os.pathsep}/elsewhere"
    done = run_child([sys.executable, "-c", "import benchmarks.timed_child as t; print(t.__file__)"], cwd=tmp_path,
                     env=env)
    assert done.returncode == 0 and done.stdout.strip() == str(ROOT / "benchmarks" / "timed_child.py"), done.stderr


def test_the_fit_command_and_its_held_out_accuracies():
    command = fit_command(["--config", "configs/quickstart.yaml"], 3, "/tmp/run", then=["--trainer.max_epochs", "2"])
    assert command[1:] == ["fit", "--config", "configs/quickstart.yaml", "--seed_everything", "3", "--data.seed", "3",
                           "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                           "--trainer.enable_checkpointing", "false", "--trainer.max_epochs", "2",
                           "--trainer.default_root_dir", "/tmp/run"]
    log = "before training: val/accuracy 0.100\nepoch 0 ...\nafter epoch 1: val/return 1 val/accuracy 0.250\n"
    assert held_out_accuracies(log, last_epoch=1) == (0.1, 0.25)
    with pytest.raises(SystemExit, match="after epoch 2"):
        held_out_accuracies(log, last_epoch=2)
