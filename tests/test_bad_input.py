"""Bad input gets a clear error before any rollout, never a stack trace from deep inside (one test per input)."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from transformers import AutoTokenizer

from lit_grpo.cli import main
from lit_grpo.cli.config_check import config_problems
from lit_grpo.cli.refusals import input_refusal
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.errors import InputError
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.policy.module import PolicyModule
from lit_grpo.tasks import JsonlTask

ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return path


def fit(model_dir: Path, task: JsonlTask, root: Path, max_new_tokens: int = 4) -> RolloutDataModule:
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 2}, kl={"coef": 0.0})
    datamodule = RolloutDataModule(task=task, group_size=2, prompts_per_epoch=2, minibatch_size=4,
                                   max_new_tokens=max_new_tokens)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=root)
    trainer.fit(module, datamodule)
    return datamodule


def test_empty_prompt_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(InputError, match=r"data file '.*empty\.jsonl' \(split 'train'\) is empty: it holds no rows"):
        JsonlTask(path=str(path)).train_records()


def test_unreadable_prompt_file(tmp_path):
    binary = tmp_path / "prompts.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InputError, match=r"data file '.*prompts\.jsonl' is not UTF-8 text \(byte 0xFF at offset 0, "
                                         r"line 1\); it seems to be UTF-16: save it as UTF-8"):
        JsonlTask(path=str(binary)).train_records()
    with pytest.raises(InputError, match=r"data file '.*' holds 'prompts\.jsonl', which is not UTF-8 text"):
        JsonlTask(path=str(tmp_path)).train_records()  # a directory (of one file that is not UTF-8)


def test_the_encoding_a_file_that_is_not_utf8_seems_to_be():
    from lit_grpo.tasks.file_problems import guessed_encoding

    assert guessed_encoding(b"caf\xe9") == "Latin-1 (ISO-8859-1)"  # é in Latin-1 (and in Windows-1252)
    assert guessed_encoding(b"\x93caf\xe9\x94") == "Windows-1252"  # “café”: 0x93/0x94 are quotes only there
    assert guessed_encoding(b"\x81") == "Latin-1 (ISO-8859-1)"  # unassigned in Windows-1252
    assert guessed_encoding(b"\xff\xfea\x00") == "UTF-16"  # its byte-order mark
    assert guessed_encoding(b"\xff\xfe\x00\x00a\x00\x00\x00") == "UTF-32"
    assert guessed_encoding(b"a\x00b\x00c\x00") == "UTF-16 LE"  # no mark: a NUL in every odd position
    assert guessed_encoding(b"\x00a\x00b\x00c") == "UTF-16 BE"


def test_a_csv_header_and_blank_lines_hold_no_rows(tmp_path):
    from lit_grpo.tasks.file_problems import csv_problem

    (tmp_path / "a.csv").write_text("prompt,answer\n\n , \n")
    assert csv_problem(tmp_path / "a.csv") == "holds only its header row (prompt,answer): no rows of data below it"
    (tmp_path / "b.csv").write_text('prompt,answer\n"1+1=\nsay it",2\n')  # one row, its field over two lines
    assert csv_problem(tmp_path / "b.csv") is None
    (tmp_path / "c.csv").write_text("\n\n")
    assert csv_problem(tmp_path / "c.csv") == "holds no CSV rows (only blank lines)"


def test_empty_prompt_file_fails_fit_before_any_rollout(tiny_llama_dir, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(InputError, match="is empty: it holds no rows"):
        fit(tiny_llama_dir, JsonlTask(path=str(path)), tmp_path)


def test_prompt_longer_than_context(tiny_llama_dir, tmp_path):
    # the test model's context is 256 tokens; its tokenizer gives one token per character plus <s>
    prompts = [f"{i}+{i}=" for i in range(10, 40)] + ["x" * 300]
    task = JsonlTask(path=str(write_jsonl(tmp_path / "p.jsonl", prompts)), heldout_fraction=0.5, split_seed=1)
    long_split = "training" if any(len(r["prompt"]) == 300 for r in task.train_records()) else "held-out"
    with pytest.raises(InputError) as info:
        fit(tiny_llama_dir, task, tmp_path)
    assert str(info.value) == (
        f"1 {long_split} prompt(s) do not fit the context of 256 tokens (the model's, or the engine's shorter "
        f"max_model_len) with 4 generated tokens (the longest has 301 tokens: {'x' * 40!r}...): shorten the prompts or lower data.max_new_tokens (or set data.long_prompts: drop)"
    )


def test_prompt_fitting_exactly_passes_the_check(tiny_llama_dir, tmp_path):
    from lit_grpo.rollout.prompt_check import check_inputs

    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 2}, kl={"coef": 0.0})
    module.configure_model()
    # 251 characters + <s> = 252 tokens, + 4 new tokens = 256: fits; one more character does not
    prompts = ["y" * 251] + [f"{i}+1=" for i in range(10, 20)]
    task = JsonlTask(path=str(write_jsonl(tmp_path / "p.jsonl", prompts)), heldout_fraction=0.1)
    check_inputs(module, task, 4, "refuse")
    with pytest.raises(InputError, match=r"context of 256 tokens \(.*\) with 5 generated tokens"):
        check_inputs(module, task, 5, "refuse")


def test_long_prompts_drop_keeps_exactly_the_prompts_that_fit_and_logs_how_many(tiny_llama_dir, tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    from lit_grpo.rollout.prompt_check import check_inputs

    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 2}, kl={"coef": 0.0})
    module.configure_model()
    # with 4 new tokens the room is 252 tokens = 251 characters + <s>: "y" * 251 fits, "z" * 252 does not
    prompts = ["y" * 251, "z" * 252, "w" * 400] + [f"{i}+1=" for i in range(10, 20)]
    task = JsonlTask(path=str(write_jsonl(tmp_path / "p.jsonl", prompts)), heldout_path=str(
        write_jsonl(tmp_path / "h.jsonl", ["v" * 300, "1+1=", "2+1="])))
    logger = CSVLogger(tmp_path, name="logs")
    check_inputs(module, task, 4, "drop", None, [logger])
    kept = sorted(r["prompt"] for r in task.train_records())
    assert kept == sorted(["y" * 251] + [f"{i}+1=" for i in range(10, 20)])
    assert sorted(r["prompt"] for r in task.heldout_records()) == ["1+1=", "2+1="]
    logger.save()
    assert (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[1].startswith("3.0,0")  # 2 + 1 dropped
    too_long = JsonlTask(path=str(write_jsonl(tmp_path / "all.jsonl", ["x" * 300, "w" * 260])),
                         heldout_path=str(tmp_path / "h.jsonl"))
    with pytest.raises(InputError, match="long_prompts drop: none of the 2 training prompts fits the "
                                         "context of 256 tokens with 4 generated tokens"):
        check_inputs(module, too_long, 4, "drop")


def test_tokenizer_without_pad_token_is_fixed_with_a_warning(tiny_llama_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token_id is None
    with pytest.warns(UserWarning, match=r"has no pad token: padding with its EOS token '</s>'"):
        fixed = load_tokenizer(str(tmp_path))
    assert fixed.pad_token == "</s>" and fixed.pad_token_id == fixed.eos_token_id == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_tokenizer(str(tiny_llama_dir))  # a tokenizer with a pad token: no warning


def test_lora_target_modules_the_model_lacks(tiny_llama_dir):
    with pytest.raises(InputError) as info:
        load_policy(str(tiny_llama_dir), 2, 4, 0.0, ["q_proj", "query_key_value"])
    assert str(info.value) == (
        "lora.target_modules: the model has no module named 'query_key_value'; its adaptable modules are: "
        "down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj (or use 'all-linear')"
    )
    with pytest.raises(InputError, match="no module named 'c_attn'"):
        load_policy(str(tiny_llama_dir), 2, 4, 0.0, "c_attn")  # a string is a regex over full names
    load_policy(str(tiny_llama_dir), 2, 4, 0.0, ["q_proj", "v_proj"])  # present: no error


def test_group_size_must_divide_minibatch_size():
    with pytest.raises(ValueError) as info:
        RolloutDataModule(group_size=3, minibatch_size=8)
    assert "minibatch_size: 8 is not a multiple of group_size (3); minibatches hold whole groups" in str(info.value)


def test_unknown_task_and_reward_class_paths():
    assert config_problems({"data": {"task": {"class_path": "my_tasks.NoSuchTask"}}}) == [
        "data.task: cannot import class_path 'my_tasks.NoSuchTask'"
    ]
    task = {"class_path": "lit_grpo.tasks.JsonlTask",
            "init_args": {"path": "p.jsonl", "reward": {"class_path": "my_rewards.NoSuchReward"}}}
    assert config_problems({"data": {"task": task}}) == [
        "data.task.reward: cannot import class_path 'my_rewards.NoSuchReward'"
    ]


@pytest.mark.slow
def test_cli_prints_a_bad_input_without_traceback(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    script = Path(sys.executable).parent / "lit-grpo"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "lit_grpo.cli"]
    args = ["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--data.task",
            "lit_grpo.tasks.JsonlTask", "--data.task.init_args.path", str(empty), "--trainer.logger", "false",
            "--trainer.max_epochs", "1"]
    result = subprocess.run(command + args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"lit-grpo: data file '{empty}' (split 'train') is empty: it holds no rows" in result.stderr
    assert "Traceback" not in result.stderr


def built_by_the_command(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> pytest.ExceptionInfo:
    """``lit-grpo fit`` on data/tiny-llama with ``args``, which must stop while its classes are built."""
    base = ["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1"]
    capsys.readouterr()
    with pytest.raises(BaseException) as info:
        main(base + args)
    return info


def test_a_bug_while_the_classes_are_built_is_shown_as_a_bug(tmp_path, capsys, monkeypatch):
    def called_wrongly(*args: Any) -> None:  # stands for a bug in lit-grpo's own code
        raise TypeError("refuse() takes 2 positional arguments but 3 were given")

    monkeypatch.setattr("lit_grpo.rollout.datamodule.refuse", called_wrongly)
    info = built_by_the_command([], tmp_path, capsys)
    assert type(info.value) is TypeError  # not an InputError, not exit code 2
    assert "lit-grpo: the configuration" not in capsys.readouterr().err
    shown = "".join(traceback.format_exception(info.value))
    assert shown.startswith("Traceback") and "in called_wrongly" in shown
    assert shown.splitlines()[-2:] == ["TypeError: refuse() takes 2 positional arguments but 3 were given",
                                       "lit-grpo: this is a bug in lit-grpo, please report it with the traceback above"]


def test_a_users_class_refusing_its_arguments_is_named_as_a_bad_input(tmp_path, capsys):
    # the user's own code refusing the user's own value: a bad input, named by the class that refused it
    reward = '[{"class_path": "tests.helpers_rewards.StrictReward", "init_args": {"scale": -1}}]'
    info = built_by_the_command(["--data.task", "lit_grpo.tasks.DatasetTask", "--data.task.path",
                                 "data/chat-addition/train.parquet", "--data.task.rewards", reward], tmp_path, capsys)
    assert info.value.args == (2,), info.value
    err = capsys.readouterr().err
    assert "lit-grpo: tests.helpers_rewards.StrictReward refused its arguments: scale must be positive, got -1.0\n" in err
    assert "Traceback" not in err


def test_what_counts_as_a_refusal_of_input():
    # raised while no class was being built, outside jsonargparse's type checks: a bug; Lightning's refusal of a
    # setting and an InputError wrapped in jsonargparse's union report: inputs
    error = TypeError("unhashable type: 'list'")
    try:
        raise error
    except TypeError:
        pass
    assert input_refusal(error) is None
    assert str(input_refusal(MisconfigurationException("`every_n_epochs` must be >= 0"))) == (
        "Lightning refused the configuration: `every_n_epochs` must be >= 0")
    wrapped = ValueError("Does not validate against any of the Union subtypes")
    wrapped.__cause__ = InputError("RewardModel 'x' is not a sequence-classification checkpoint")
    assert input_refusal(wrapped) is wrapped.__cause__


@pytest.mark.slow
def test_the_command_prints_a_bugs_traceback_and_asks_to_report_it(tmp_path):
    program = ("import sys, lit_grpo.rollout.datamodule as data\n"
               "def called_wrongly(*args): raise TypeError('refuse() takes 2 positional arguments but 3 were given')\n"
               "data.refuse = called_wrongly\n"
               "from lit_grpo.cli import main\n"
               "main(sys.argv[1:])\n")
    args = ["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--trainer.logger", "false",
            "--trainer.max_epochs", "1"]
    result = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().endswith(
        "TypeError: refuse() takes 2 positional arguments but 3 were given\n"
        "lit-grpo: this is a bug in lit-grpo, please report it with the traceback above")


def test_the_context_is_the_engines_where_it_is_set_shorter_than_the_models():
    """vLLM refuses a prompt past its max_model_len: the prompt check and a turn's checks take the shorter limit."""
    from types import SimpleNamespace

    from lit_grpo.engines import HFEngine
    from lit_grpo.engines.base import context_limit
    from lit_grpo.engines.vllm_engine import VLLMEngine

    assert context_limit(VLLMEngine(max_model_len=96), 2048) == 96  # nothing loads before its first use
    assert context_limit(HFEngine(), 2048) == 2048
    assert context_limit(SimpleNamespace(max_model_len=96), 2048) == 96
    assert context_limit(SimpleNamespace(max_model_len=None), 2048) == 2048
    assert context_limit(SimpleNamespace(max_model_len=4096), 2048) == 2048
    assert context_limit(SimpleNamespace(), 2048) == 2048  # an engine without the knob (transformers')
    assert context_limit(SimpleNamespace(max_model_len=96), None) == 96
    assert context_limit(SimpleNamespace(), None) is None
