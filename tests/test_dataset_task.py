"""DatasetTask (issue 19): data through ``datasets``, conversational prompts through the chat template, rewards as
TRL users write them (batched, weighted, None = does not apply), per-reward metrics, and a TRL-style setup through
the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_grpo.errors import InputError
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.tasks import DatasetTask, Reward

ROOT = Path(__file__).resolve().parents[1]
CHAT_MODEL = ROOT / "data" / "tiny-qwen2-chat"
CHAT_DATA = ROOT / "data" / "chat-addition"
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]
CALLS: list[dict] = []


def exact(completions, solution, **kwargs):
    CALLS.append({"completions": completions, "solution": solution, **kwargs})
    return [1.0 if c[0]["content"] == s else 0.0 for c, s in zip(completions, solution)]


def halves(completions, solution, **kwargs):
    return [None if s == "none" else 0.5 for s in solution]


def broken(completions, **kwargs):
    raise RuntimeError("no GPU here")


class Longest(Reward):
    min_value = 0.0

    def __call__(self, prompt_record, completion_text, completion_ids):
        if completion_text == "boom":
            raise ValueError("boom")
        return float(len(completion_text))


def chat_rows(tmp_path: Path, solutions: list[str]) -> str:
    import datasets

    rows = [{"prompt": CONVERSATION, "solution": s, "task_id": f"t{i}"} for i, s in enumerate(solutions)]
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(rows).to_parquet(path)
    return str(path)


def task(tmp_path: Path, rewards: list, weights: list[float] | None = None, **kwargs) -> DatasetTask:
    path = chat_rows(tmp_path, ["4", "none", "5", "4"])
    return DatasetTask(path, answer_column="solution", rewards=rewards, reward_weights=weights, failure_reward=-1.0,
                       **kwargs)


def test_trl_functions_get_the_batch_as_trl_passes_it_and_none_leaves_the_others_weighted_sum(tmp_path):
    this = f"{__name__}"
    scoring = task(tmp_path, [f"{this}.exact", f"{this}.halves"], [1.0, 0.5])
    records = scoring.records(scoring.path, "train")
    CALLS.clear()
    scored = scoring.score_group(records, ["4", "4", "9", "x"], [[1], [2], [3], [4]])
    # exact: 1, 0 (solution "none"), 0, 0; halves: 0.5, None, 0.5, 0.5 -> 1 + 0.25, 0 (halves does not apply),
    # 0 + 0.25, 0 + 0.25
    assert [s.reward for s in scored] == [1.25, 0.0, 0.25, 0.25]
    assert [s.parts for s in scored][1] == {"exact": 0.0, "halves": None}
    (call,) = CALLS  # one call for the whole batch, every column as a list, completions as assistant messages
    assert call["completions"][0] == [{"role": "assistant", "content": "4"}]
    assert call["prompts"] == [CONVERSATION] * 4 and call["task_id"] == ["t0", "t1", "t2", "t3"]
    assert call["completion_ids"] == [[1], [2], [3], [4]] and call["solution"] == ["4", "none", "5", "4"]


def test_no_reward_applying_or_a_reward_raising_scores_the_failure_reward(tmp_path):
    this = f"{__name__}"
    only_halves = task(tmp_path, [f"{this}.halves"])
    scored = only_halves.score_group(only_halves.records(only_halves.path, "train")[:2], ["a", "b"], [[1], [2]])
    assert [s.reward for s in scored] == [0.5, -1.0] and "no reward applies" in scored[1].error
    with_broken = task(tmp_path, [f"{this}.exact", f"{this}.broken"])
    scored = with_broken.score_group(with_broken.records(with_broken.path, "train")[:2], ["4", "4"], [[1], [2]])
    assert [s.reward for s in scored] == [-1.0, -1.0]  # a batched function fails for its whole batch
    assert scored[0].error == "broken: RuntimeError: no GPU here"
    # a Reward class is called per completion and fails alone
    per_completion = task(tmp_path, [Longest()])
    scored = per_completion.score_group(per_completion.records(per_completion.path, "train")[:2], ["boom", "abc"], [[1], [2]])
    assert [s.reward for s in scored] == [-1.0, 3.0] and scored[0].error == "Longest: ValueError: boom"


def test_a_reward_file_written_for_trl_loads_by_path(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # configs name it relative to where the command runs
    scoring = task(tmp_path, ["examples/trl_rewards.py:accuracy", "examples/trl_rewards.py:brevity"], [1.0, 0.5])
    assert scoring.names == ["accuracy", "brevity"]
    scored = scoring.score_group(scoring.records(scoring.path, "train")[:1], ["4"], [[1]])
    assert scored[0].parts == {"accuracy": 1.0, "brevity": None}  # solution "4" has one digit: brevity skips it
    with pytest.raises(InputError, match="not a Reward class path nor a function"):
        DatasetTask(chat_rows(tmp_path, ["1", "2"]), rewards=["examples/trl_rewards.py:nothing"], failure_reward=0.0)
    with pytest.raises(ValueError, match=r"rewards \['accuracy'\] declare no min_value"):
        DatasetTask(chat_rows(tmp_path, ["1", "2"]), rewards=["examples/trl_rewards.py:accuracy"])


def test_a_conversation_is_tokenised_as_the_chat_template_renders_it_never_as_a_repr(tmp_path):
    tokenizer = load_tokenizer(str(CHAT_MODEL))
    scoring = task(tmp_path, [f"{__name__}.exact"])
    record = scoring.records(scoring.path, "train")[0]
    seen = []
    original = type(tokenizer).__call__

    def recording(self, text, *args, **kwargs):
        seen.append(text)
        return original(self, text, *args, **kwargs)

    type(tokenizer).__call__ = recording
    try:
        ids = scoring.prompt_ids(record, tokenizer)
    finally:
        type(tokenizer).__call__ = original
    expected = tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert ids == list(expected)
    assert all(isinstance(text, str) and not text.lstrip().startswith(("[{", "{'")) for text in seen)
    assert "Be brief." in tokenizer.decode(ids)  # the system message is kept


def test_held_out_prompts_are_disjoint_by_conversation_and_a_test_split_is_used_as_given():
    scoring = DatasetTask(str(CHAT_DATA / "train.parquet"), answer_column="solution", heldout_fraction=0.1)
    train, validation, test = scoring.split()
    assert (len(train), len(validation), len(test)) == (216, 12, 12)
    keys = lambda records: {repr(r["prompt"]) for r in records}  # noqa: E731
    assert not keys(train) & keys(validation + test) and not keys(validation) & keys(test)
    with pytest.raises(InputError, match="row 0: no 'question' column \\(it has: prompt, solution, task_id\\)"):
        DatasetTask(str(CHAT_DATA / "train.parquet"), prompt_column="question").split()
    with pytest.raises(InputError, match="data file '.*missing.parquet' does not exist"):
        DatasetTask(str(CHAT_DATA / "missing.parquet")).split()


@pytest.mark.slow
def test_a_trl_style_setup_trains_through_the_command_and_logs_each_reward(tmp_path):
    # the shipped config as a TRL user writes it: Parquet with system + user prompts and a solution column, two
    # TRL reward functions weighted 1.0 and 0.5, one of them None for the samples it does not judge
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", "configs/trl_style.yaml",
               "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path),
               "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    (events,) = [p for p in tmp_path.rglob("events.out.tfevents.*")]
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    for name in ("accuracy", "brevity"):
        assert {f"rollout/rewards/{name}/mean", f"rollout/rewards/{name}/std"} <= tags
    brevity = accumulator.Scalars("rollout/rewards/brevity/mean")[0].value
    assert brevity < 0  # judged (negative) where it applied; the None samples are left out of its mean


def test_conversations_with_a_tokenizer_without_a_chat_template_are_refused_before_any_rollout(tmp_path, capsys):
    import datasets

    from lit_grpo.cli import main

    rows = [{"prompt": [{"role": "user", "content": f"{n}+1="}], "answer": str(n + 1)} for n in range(8)]
    path = str(tmp_path / "distinct.parquet")
    datasets.Dataset.from_list(rows).to_parquet(path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--data.task",
              "lit_grpo.tasks.DatasetTask", "--data.task.path", path, "--data.task.heldout_fraction", "0.25",
              "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "runs"),
              "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "the training prompts are conversations (lists of chat messages) but the tokenizer of" in err
    assert "epoch 0:" not in err  # refused before generating anything


def test_every_source_type_gives_the_same_records_and_a_hub_id_not_in_the_cache_is_refused_offline(tmp_path,
                                                                                                   monkeypatch):
    import socket

    import datasets

    connections = []
    def refuse(*args, **kwargs):
        connections.append(args[:2])
        raise OSError("the test allows no network")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)

    rows = [{"prompt": f"{n}+1=", "answer": f"={n + 1}", "task_id": f"t{n}"} for n in range(6)]  # CSV would read "1" as 1
    data = datasets.Dataset.from_list(rows)
    (tmp_path / "rows.jsonl").write_text("".join(f'{{"prompt": "{r["prompt"]}", "answer": "{r["answer"]}", '
                                                 f'"task_id": "{r["task_id"]}"}}\n' for r in rows))
    data.to_json(tmp_path / "rows.json", lines=False)
    data.to_parquet(tmp_path / "rows.parquet")
    data.to_csv(tmp_path / "rows.csv", index=False)
    data.save_to_disk(tmp_path / "saved")
    datasets.DatasetDict({"train": data, "test": data.select([0])}).save_to_disk(tmp_path / "saved_dict")
    (tmp_path / "folder").mkdir()
    data.to_parquet(tmp_path / "folder" / "part-0.parquet")
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    for source in ("rows.jsonl", "rows.json", "rows.parquet", "rows.csv", "saved", "saved_dict", "folder", arrow):
        task = DatasetTask(str(tmp_path / source))
        assert task.records(task.path, "train") == rows, source
    assert DatasetTask(str(tmp_path / "saved_dict")).records(str(tmp_path / "saved_dict"), "test") == rows[:1]
    with pytest.raises(InputError, match=r"data file 'nobody/no-such-dataset' \(split 'train'\) cannot be read: .*"
                                         r"or a hub id already in the local cache\)"):
        DatasetTask("nobody/no-such-dataset").records("nobody/no-such-dataset", "train")
    assert connections == []  # offline: not even an attempt to reach the hub
