"""Resuming and starting from saved adapters (issue 34, part 4): what a checkpoint's prompt cursor indexes and what
its adapter was trained on are compared with this run's before training, and a misfit is refused by name.

A run's config.yaml edited to another task and resumed with ``--ckpt_path last``; a checkpoint resumed on another
base model; an ``init_adapter`` of another base model: each is one message naming the input and what to do, exit
code 2, no traceback, the checkpoint untouched, nothing trained. A checkpoint written before tasks were recorded
resumes with a note. Where the shapes cannot be told before loading, the load itself gives the same kind of message.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from reliability_doc import documented
from support import load_checkpoint

from lit_grpo.cli import main
from lit_grpo.errors import InputError
from lit_grpo.run.model_files import PROJECT_ROOT
from lit_grpo.rollout.cursor import task_record
from lit_grpo.run.resume import task_notes
from lit_grpo.tasks import JsonlTask

TESTS = Path(__file__).resolve().parent
COMMAND = Path(sys.executable).parent / "lit-grpo"
LLAMA, QWEN = "data/tiny-llama", "data/tiny-qwen2-chat"  # shipped: hidden 256 x 4 layers, hidden 64 x 2 layers
RUN = {
    "seed_everything": 0,
    "trainer": {"max_epochs": 1, "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 0},
    "model": {"model_name_or_path": LLAMA, "lora": {"rank": 4}},
    "data": {"task": {"class_path": "lit_grpo.tasks.ArithmeticTask"}, "prompts_per_epoch": 2, "group_size": 2,
             "minibatch_size": 4, "max_new_tokens": 3},
}


def lit_grpo(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``lit-grpo <args>`` run in ``cwd`` (its default log directory is ``cwd/lightning_logs``)."""
    return subprocess.run([str(COMMAND), *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    """One epoch of ArithmeticTask on data/tiny-llama, logged to ``<dir>/lightning_logs/version_0`` (its config.yaml,
    checkpoints and adapter)."""
    run_dir = tmp_path_factory.mktemp("first-run")
    (run_dir / "run.yaml").write_text(yaml.safe_dump(RUN))
    done = lit_grpo(run_dir, "fit", "--config", "run.yaml")
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = load_checkpoint(run_dir / "lightning_logs/version_0/checkpoints/last.ckpt")
    assert checkpoint["RolloutDataModule"]["task"]["class"] == "lit_grpo.tasks.single_turn.arithmetic.ArithmeticTask"
    return run_dir


@pytest.fixture
def run_copy(first_run, tmp_path) -> Path:
    """A copy of the first run's directory, for a test to edit and resume."""
    return Path(shutil.copytree(first_run, tmp_path / "run", symlinks=True))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(done: subprocess.CompletedProcess, tmp_path: Path) -> str:
    """The one message of a run refused before training: exit code 2, no traceback, no rollout, no weights read
    (``model.dtype auto`` speaks as the weights load); returned with ``tmp_path`` shown as ``<tmp>``."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output[-3000:]
    assert "Traceback" not in output
    assert "epoch 1:" not in output and "epoch 0:" not in output  # no rollout
    assert "model.dtype auto" not in output  # no weights read
    messages = [line for line in done.stderr.splitlines() if line.startswith("lit-grpo:")]
    assert len(messages) == 1, done.stderr
    rest = done.stderr.split(messages[0], 1)[1]  # a configuration problem is listed below its heading
    return (messages[0] + rest.rstrip()).replace(str(tmp_path), "<tmp>").replace(f"{PROJECT_ROOT}/", "<checkout>/")


@pytest.mark.slow
def test_a_config_edited_to_another_task_is_refused_before_training(run_copy, tmp_path):
    version = run_copy / "lightning_logs" / "version_0"
    config = yaml.safe_load((version / "config.yaml").read_text())
    config["data"]["task"] = {"class_path": "lit_grpo.tasks.SortTask"}
    (version / "config.yaml").write_text(yaml.safe_dump(config))
    before = digest(version / "checkpoints" / "last.ckpt")
    done = lit_grpo(run_copy, "fit", "--config", str(version / "config.yaml"), "--trainer.max_epochs", "2",
                    "--ckpt_path", "last")
    message = refused(done, tmp_path)
    assert message.startswith("lit-grpo: cannot resume '<tmp>/run/lightning_logs/version_0/checkpoints/last.ckpt': "
                              "its prompt cursor (2) counts the training prompts of ArithmeticTask")
    assert "this run's data.task is SortTask (lit_grpo.tasks.single_turn.sort.SortTask" in message
    assert "Resume with the checkpoint's task" in message and "start a new run without --ckpt_path" in message
    assert digest(version / "checkpoints" / "last.ckpt") == before
    assert not list(run_copy.glob("lightning_logs/version_1/checkpoints/*"))
    documented("resume with `--ckpt_path last` after the run's config.yaml was edited to another task",
               f"exit {done.returncode} before any weights load, the checkpoint untouched: {message}",
               "test_resume_adapters.py")


@pytest.mark.slow
def test_a_checkpoint_of_another_base_model_is_refused_before_weights_load(run_copy, tmp_path):
    version = run_copy / "lightning_logs" / "version_0"
    before = digest(version / "checkpoints" / "last.ckpt")
    done = lit_grpo(run_copy, "fit", "--config", str(version / "config.yaml"), "--trainer.max_epochs", "2",
                    "--model.model_name_or_path", QWEN, "--ckpt_path", "last")
    message = refused(done, tmp_path)
    assert message.startswith(f"lit-grpo: cannot resume '<tmp>/run/lightning_logs/version_0/checkpoints/last.ckpt': "
                              f"it was trained on {LLAMA!r} and its adapter does not fit this run's "
                              f"model.model_name_or_path {QWEN!r}: ")
    assert "lora_A.default.weight is [4, 256] in the checkpoint, [4, 64] in this model" in message
    assert message.endswith(f"Resume with --model.model_name_or_path {LLAMA}, or start a new run on {QWEN!r} "
                            "without --ckpt_path")
    assert digest(version / "checkpoints" / "last.ckpt") == before
    documented(f"resume on another base model (`{QWEN}` for a `{LLAMA}` checkpoint)",
               f"exit {done.returncode} before any weights load, the checkpoint untouched: {message}",
               "test_resume_adapters.py")


@pytest.mark.slow
def test_an_init_adapter_of_another_base_model_is_refused_before_weights_load(run_copy, tmp_path):
    adapter = run_copy / "lightning_logs" / "version_0" / "adapter"
    before = digest(adapter / "adapter_model.safetensors")
    done = lit_grpo(run_copy, "fit", "--config", "run.yaml", "--model.model_name_or_path", QWEN,
                    "--model.init_adapter", str(adapter))
    message = refused(done, tmp_path)
    assert message.startswith("lit-grpo: the configuration has 1 problem(s):")
    # PEFT saved the path the model was loaded from (data/... is resolved in the checkout)
    assert (f"model.init_adapter: '<tmp>/run/lightning_logs/version_0/adapter' was trained on '<checkout>/{LLAMA}' "
            f"(its adapter_config.json's base_model_name_or_path) and does not fit model.model_name_or_path {QWEN!r}: "
            in message)
    assert "lora_A.weight is [4, 256] in the adapter, [4, 64] in this model" in message
    assert message.endswith(f"set model.model_name_or_path to the model the adapter was trained on, or give an "
                            f"adapter trained on {QWEN!r}")
    assert digest(adapter / "adapter_model.safetensors") == before
    documented("an `init_adapter` trained on another base model",
               f"exit {done.returncode} before any weights load: " + " ".join(message.split()),
               "test_resume_adapters.py")


@pytest.mark.slow
def test_a_checkpoint_without_a_task_record_resumes_with_a_note(first_run, tmp_path, capsys):
    checkpoint = load_checkpoint(first_run / "lightning_logs/version_0/checkpoints/last.ckpt")
    del checkpoint["RolloutDataModule"]["task"]  # as written before tasks were recorded
    torch.save(checkpoint, tmp_path / "old.ckpt")
    config = first_run / "lightning_logs" / "version_0" / "config.yaml"
    main(["fit", "--config", str(config), "--trainer.max_epochs", "2", "--trainer.logger", "false",
          "--trainer.default_root_dir", str(tmp_path / "resumed"), "--ckpt_path", str(tmp_path / "old.ckpt")])
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if "does not record its task" in line)
    assert "its prompt cursor (2) continues in this run's task, ArithmeticTask" in note
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert resumed["epoch"] == 1 and resumed["RolloutDataModule"]["cursor"] == 4  # trained on from prompt 2
    assert resumed["RolloutDataModule"]["task"] == load_checkpoint(
        first_run / "lightning_logs/version_0/checkpoints/last.ckpt")["RolloutDataModule"]["task"]
    documented("resume of a checkpoint written before tasks were recorded",
               "trained on from its cursor; the next checkpoint records the task; noted: "
               + note.strip().replace(str(tmp_path), "<tmp>"), "test_resume_adapters.py")


@pytest.mark.slow
def test_a_misfit_found_only_at_load_is_one_message(first_run, tmp_path, capsys, monkeypatch):
    """Where config.json cannot tell the shapes before loading (``expected_adapter_shapes`` gives None), the load
    names the misfit itself: the checkpoint's in ``on_load_checkpoint``, the adapter's in ``load_policy``."""
    from lit_grpo.policy import model_loading

    monkeypatch.setattr(model_loading, "expected_adapter_shapes", lambda *args: None)
    config = first_run / "lightning_logs" / "version_0" / "config.yaml"
    shutil.copy(first_run / "lightning_logs/version_0/checkpoints/last.ckpt", tmp_path / "start.ckpt")
    before = digest(tmp_path / "start.ckpt")
    common = ["fit", "--config", str(config), "--trainer.max_epochs", "2", "--trainer.logger", "false",
              "--model.model_name_or_path", QWEN]
    with pytest.raises(SystemExit) as info:
        main([*common, "--trainer.default_root_dir", str(tmp_path / "a"), "--ckpt_path", str(tmp_path / "start.ckpt")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and "epoch 1:" not in err
    message = next(line for line in err.splitlines() if "cannot resume" in line).replace(str(tmp_path), "<tmp>")
    assert message.startswith(f"lit-grpo: cannot resume '<tmp>/start.ckpt': it was trained on {LLAMA!r} and its "
                              f"adapter does not fit this run's model.model_name_or_path {QWEN!r}: ")
    assert digest(tmp_path / "start.ckpt") == before

    adapter = first_run / "lightning_logs" / "version_0" / "adapter"
    with pytest.raises(SystemExit) as info:
        main([*common, "--trainer.default_root_dir", str(tmp_path / "b"), "--model.init_adapter", str(adapter)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and "epoch 0:" not in err
    adapter_message = next(line for line in err.splitlines() if "init_adapter" in line)
    assert (f"init_adapter: {str(adapter)!r} was trained on {str(PROJECT_ROOT / LLAMA)!r} (its "
            "adapter_config.json's base_model_name_or_path) and does not fit model.model_name_or_path "
            in adapter_message)
    assert "size mismatch for base_model.model.model.layers." in adapter_message
    documented("resume on, or `init_adapter` from, another base model when config.json cannot tell the shapes "
               "before loading", f"exit {info.value.code} once the model loaded, before training, one message each "
               "(the adapter's names it, its base, this run's model and the first size mismatch); the checkpoint's: "
               + message, "test_resume_adapters.py")


def jsonl(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return str(path)


def test_the_task_record_follows_the_prompts_not_the_file_name(tmp_path):
    prompts = [f"{i}+{i}=" for i in range(40)]
    first = task_record(JsonlTask(jsonl(tmp_path / "a.jsonl", prompts)))
    moved = task_record(JsonlTask(jsonl(tmp_path / "moved.jsonl", prompts)))
    other = task_record(JsonlTask(jsonl(tmp_path / "b.jsonl", [p + " " for p in prompts])))
    assert first["data"] != moved["data"] and task_notes("x.ckpt", {"cursor": 4, "task": first},
                                                          task_record(JsonlTask(moved["data"]))) == []
    with pytest.raises(InputError) as info:
        task_notes("x.ckpt", {"cursor": 4, "task": first}, task_record(JsonlTask(other["data"])))
    assert f"JsonlTask (lit_grpo.tasks.single_turn.jsonl.JsonlTask from {first['data']!r}: 36 training prompts" in str(info.value)
    assert f"this run's data.task is JsonlTask (lit_grpo.tasks.single_turn.jsonl.JsonlTask from {other['data']!r}" in str(
        info.value)
    assert task_notes("x.ckpt", {"cursor": 4}, task_record(JsonlTask(other["data"])))[0].startswith(
        "the checkpoint does not record its task (an older lit-grpo wrote it): its prompt cursor (4) continues")
    assert task_notes("x.ckpt", None, task_record(JsonlTask(other["data"]))) == []  # no datamodule state: no cursor
    torch.save(first, tmp_path / "record.pt")
    assert torch.load(tmp_path / "record.pt", weights_only=True) == first  # plain strings and ints


def test_a_checkpoint_of_a_task_at_its_old_path_resumes_and_another_class_name_is_refused(tmp_path):
    # issue 60 moved the tasks by kind: a checkpoint written before names lit_grpo.tasks.jsonl.JsonlTask
    prompts = [f"{i}+{i}=" for i in range(40)]
    now = task_record(JsonlTask(jsonl(tmp_path / "a.jsonl", prompts)))
    assert now["class"] == "lit_grpo.tasks.single_turn.jsonl.JsonlTask"
    before = {**now, "class": "lit_grpo.tasks.jsonl.JsonlTask"}
    assert task_notes("x.ckpt", {"cursor": 4, "task": before}, now) == []
    with pytest.raises(InputError, match="counts the training prompts of OtherTask"):
        task_notes("x.ckpt", {"cursor": 4, "task": {**now, "class": "lit_grpo.tasks.single_turn.jsonl.OtherTask"}},
                   now)
