"""Training, validation and test prompts (issue 40 item 6): every shipped task gives validation and test prompts that
are disjoint and non-empty, and training shares no prompt with either; `test_dataloader` serves the test split and
validation (what every calibration reads) never does; training is the training of the tasks before test splits."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import lit_grpo.tasks
from lit_grpo.errors import InputError
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.tasks import ArithmeticTask, DatasetTask, JsonlTask, Task
from lit_grpo.tasks.base import prompt_text

ROOT = Path(__file__).resolve().parents[1]
CHAT_DATA = "data/chat-addition/train.parquet"

# What a shipped task needs to be built (the others build with their defaults).
REQUIRED_ARGUMENTS: dict[str, dict[str, Any]] = {
    "DatasetTask": {"path": CHAT_DATA, "answer_column": "solution"},
    "JsonlTask": {"path": "<jsonl>"},  # a file written by the test
    "ToolTask": {"records": [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(40)],
                 "rewards": ["lit_grpo.tasks.tools.calls.environment_tools"], "heldout_size": 10},  # any function: not run
}


def identity(record: dict[str, Any]) -> Any:
    """What a task guarantees never to repeat across splits: the problem behind the prompt in the games (their
    texts repeat: every ``?+?=`` of the hidden-operands game reads the same, and a stale digit can show another
    code), else the prompt text."""
    for problem in ("digits", "operands"):
        if problem in record:
            return problem, tuple(record[problem])
    return ("pair", record["a"], record["b"]) if "a" in record else prompt_text(record)


def shipped_task_classes() -> dict[str, type[Task]]:
    """Every concrete Task subclass defined in ``lit_grpo.tasks`` and its sub-packages (the old paths' aliases define
    none)."""
    found: dict[str, type[Task]] = {}
    for module_info in pkgutil.walk_packages(lit_grpo.tasks.__path__, "lit_grpo.tasks."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, Task) and not inspect.isabstract(value)
                    and value.__module__ == module.__name__):
                found[name] = value
    return found


def built(cls: type[Task], tmp_path: Path) -> Task:
    arguments = dict(REQUIRED_ARGUMENTS.get(cls.__name__, {}))
    if arguments.get("path") == "<jsonl>":
        path = tmp_path / "prompts.jsonl"
        path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
        arguments["path"] = str(path)
    return cls(**arguments)


def assert_disjoint_splits(task: Task) -> None:
    train, validation, test = task.train_records(), task.validation_records(), task.test_records()
    assert len(train) and len(validation) and len(test)
    ids = lambda records: {identity(r) for r in records}  # noqa: E731
    assert not ids(validation) & ids(test)
    assert not ids(train) & ids(validation) and not ids(train) & ids(test)
    assert list(task.heldout_records()) == [*validation, *test]


def test_the_shipped_tasks_are_the_ones_covered_here():
    assert set(shipped_task_classes()) == {"ArithmeticTask", "SortTask", "ClarifyTask", "HiddenOperandsTask",
                                           "CalculatorTask", "StaleDigitsTask", "DatasetTask", "JsonlTask",
                                           "ToolTask"}


@pytest.mark.parametrize("name", sorted(shipped_task_classes()))
def test_every_shipped_task_gives_disjoint_non_empty_validation_and_test_splits(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert_disjoint_splits(built(shipped_task_classes()[name], tmp_path))


def config_task(config: Path) -> Task:
    spec = yaml.safe_load(config.read_text())["data"]["task"]
    module_name, class_name = spec["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)(**spec.get("init_args", {}))


@pytest.mark.parametrize("config", sorted(ROOT.glob("configs/*.yaml")), ids=lambda path: path.name)
def test_every_configs_task_gives_disjoint_non_empty_validation_and_test_splits(config, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert_disjoint_splits(config_task(config))


def fingerprint(records: Any) -> str:
    return hashlib.sha256("\x1e".join(prompt_text(r) + "\x1f" + str(r.get("answer")) for r in records).encode()
                          ).hexdigest()[:16]


# (training size, fingerprint) of each task's training prompts in order, taken with the code before test splits
# (commit cfa0185): a test split must take nothing from training nor reorder it.
TRAINING_BEFORE_TEST_SPLITS = {
    "ArithmeticTask": (7100, "0b5175e4fdee225a"),
    "SortTask": (10000, "b3eddd228f8dd93e"),
    "ClarifyTask": (7100, "624d7330ef31268c"),
    "HiddenOperandsTask": (7600, "8fd44f0650bb5788"),
    "CalculatorTask": (900, "cf6c50426e3ae4ae"),
    "StaleDigitsTask": (2416, "65954e0034fd1752"),
    "DatasetTask": (216, "261476578836f63a"),
}


@pytest.mark.parametrize("name", sorted(TRAINING_BEFORE_TEST_SPLITS))
def test_training_prompts_are_those_of_before_test_splits(name, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    train = built(shipped_task_classes()[name], tmp_path).train_records()
    assert (len(train), fingerprint(train)) == TRAINING_BEFORE_TEST_SPLITS[name]


def test_a_validation_of_at_most_half_the_held_out_prompts_reads_the_prompts_it_read_before():
    # the first 500 held-out prompts of arithmetic and the clarify game (val_max_prompts 500 in its configs), the
    # first 200 of the hidden-operands game (hidden_risk.yaml), and sort's 500, before test splits (commit cfa0185)
    from lit_grpo.tasks import ClarifyTask, SortTask
    from lit_grpo.tasks.games import HiddenOperandsTask

    assert fingerprint(ArithmeticTask().validation_records()) == "776d4c2d8aae8991"
    assert fingerprint(ClarifyTask().validation_records()) == "efa61b9b6b99822d"
    assert fingerprint(HiddenOperandsTask().validation_records()[:200]) == "306c6cb44afcc645"
    assert fingerprint(SortTask().validation_records()) == "0d4b6f51678cf786"


class HeldOutOnly(Task):
    """A user's task written before test splits: ``split()`` gives (training, held-out)."""

    def split(self):
        records = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(10)]
        return records[4:], records[:4]


def test_a_task_with_only_a_held_out_split_validates_on_it_and_is_refused_by_test():
    task = HeldOutOnly()
    assert [r["prompt"] for r in task.validation_records()] == ["0+0=", "1+0=", "2+0=", "3+0="]
    assert list(task.heldout_records()) == list(task.validation_records())
    with pytest.raises(InputError, match=r"HeldOutOnly gives no test split \(its split\(\) returns \(training, "
                                         r"held-out\).*return \(training, validation, test\) from split\(\)"):
        task.test_records()


def write_jsonl(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "1"}) + "\n" for p in prompts))
    return str(path)


def test_a_dataset_with_named_validation_and_test_splits_uses_each_whole_and_training_whole(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [f"t{i}" for i in range(6)])
    validation = write_jsonl(tmp_path / "validation.jsonl", ["v0", "v1"])
    test = write_jsonl(tmp_path / "test.jsonl", ["s0", "s1", "s2"])
    task = DatasetTask(train, test_path=test, validation_path=validation)
    assert sorted(r["prompt"] for r in task.train_records()) == [f"t{i}" for i in range(6)]
    assert [r["prompt"] for r in task.validation_records()] == ["v0", "v1"]
    assert [r["prompt"] for r in task.test_records()] == ["s0", "s1", "s2"]
    with pytest.raises(InputError, match="the validation split .* shares 1 prompt\\(s\\) with the test split"):
        DatasetTask(train, test_path=test, validation_path=write_jsonl(tmp_path / "v.jsonl", ["v0", "s1"])).split()
    with pytest.raises(InputError, match="the test split .* shares 1 prompt\\(s\\) with the training split"):
        DatasetTask(train, test_path=write_jsonl(tmp_path / "s.jsonl", ["t3", "s9"])).split()


def test_a_jsonl_held_out_file_is_divided_by_prompt_and_training_stays_whole(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [f"t{i}" for i in range(6)])
    held = write_jsonl(tmp_path / "held.jsonl", ["h0", "h1", "h0", "h2", "h3"])  # h0 twice: both on one side
    task = JsonlTask(train, heldout_path=held)
    assert sorted(r["prompt"] for r in task.train_records()) == [f"t{i}" for i in range(6)]
    assert [r["prompt"] for r in task.validation_records()] == ["h0", "h1", "h0"]  # 2 of 4 distinct, in order
    assert [r["prompt"] for r in task.test_records()] == ["h2", "h3"]
    drawn = DatasetTask(write_jsonl(tmp_path / "one.jsonl", [f"p{i}" for i in range(10)]), heldout_fraction=0.1)
    assert len(drawn.train_records()) == 9 and len(drawn.validation_records()) == 1
    with pytest.raises(InputError, match="test split is empty \\(too few held-out prompts"):
        drawn.test_records()  # one prompt held out: it validates, and test has nothing to read


def test_a_dataset_with_one_named_held_out_split_uses_it_whole_and_draws_the_other_from_training(tmp_path):
    # a dataset's own test split stays the test split, every prompt of it; validation is heldout_fraction of the
    # training prompts: 10 distinct x 0.2 = 2 drawn, 8 train (and the same the other way round)
    train = write_jsonl(tmp_path / "train.jsonl", [f"t{i}" for i in range(10)])
    held = write_jsonl(tmp_path / "held.jsonl", ["h0", "h1", "h0", "h2", "h3"])
    only_test = DatasetTask(train, test_path=held, heldout_fraction=0.2)
    assert [r["prompt"] for r in only_test.test_records()] == ["h0", "h1", "h0", "h2", "h3"]
    kept = [r["prompt"] for r in only_test.train_records()]
    validating = [r["prompt"] for r in only_test.validation_records()]
    assert (len(kept), len(validating)) == (8, 2) and sorted(kept + validating) == sorted(f"t{i}" for i in range(10))
    only_validation = DatasetTask(train, validation_path=held, heldout_fraction=0.2)
    assert [r["prompt"] for r in only_validation.validation_records()] == ["h0", "h1", "h0", "h2", "h3"]
    kept = [r["prompt"] for r in only_validation.train_records()]
    testing = [r["prompt"] for r in only_validation.test_records()]
    assert (len(kept), len(testing)) == (8, 2) and sorted(kept + testing) == sorted(f"t{i}" for i in range(10))
    with pytest.raises(InputError, match="heldout_fraction must be in \\(0, 1\\), got 0"):
        DatasetTask(train, test_path=held, heldout_fraction=0)  # validation is drawn with it
    DatasetTask(train, test_path=held, validation_path=held, heldout_fraction=0)  # both named: it is not used


class Scored:
    """Stands in for the policy's greedy scoring: records what each loader asks to score."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, module: Any, records: list[dict[str, Any]], *prompts: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.asked += [r["prompt"] for r in records]
        return torch.zeros(len(records)), torch.zeros(len(records), dtype=torch.bool)


def loaders_data(task: Task, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> tuple[RolloutDataModule, Scored]:
    data = RolloutDataModule(task=task, group_size=2, prompts_per_epoch=2, minibatch_size=4, **settings)
    scored = Scored()
    monkeypatch.setattr(data, "checked_module", lambda: None)
    monkeypatch.setattr(data, "greedy_scores", scored)
    return data, scored


def test_test_dataloader_serves_the_test_split_and_validation_and_calibration_never_read_it(monkeypatch):
    task = ArithmeticTask(heldout_size=40)
    data, scored = loaders_data(task, monkeypatch, val_batch_size=8)
    batches = list(data.test_dataloader())
    assert len(batches) == 3 and scored.asked == [r["prompt"] for r in task.test_records()]  # all 20, in order
    scored.asked.clear()
    list(data.val_dataloader())
    assert scored.asked == [r["prompt"] for r in task.validation_records()]
    assert not set(scored.asked) & {r["prompt"] for r in task.test_records()}
    # RiskThreshold's calibration and the budget's last validation read val_records / val_dataloader
    limited, _ = loaders_data(ArithmeticTask(heldout_size=40), monkeypatch, val_max_prompts=5)
    assert [r["prompt"] for r in limited.val_records()] == [r["prompt"] for r in task.validation_records()[:5]]


def test_test_dataloader_refuses_a_task_without_a_test_split(monkeypatch):
    data, scored = loaders_data(HeldOutOnly(), monkeypatch)
    with pytest.raises(InputError, match="HeldOutOnly gives no test split"):
        data.test_dataloader()
    assert scored.asked == []
    list(data.val_dataloader())
    assert scored.asked == ["0+0=", "1+0=", "2+0=", "3+0="]


def test_prompts_dropped_for_length_leave_validation_and_test_apart():
    task = ArithmeticTask(heldout_size=10)
    validation, test = list(task.validation_records()), list(task.test_records())
    kept = validation[1:] + test[:-2]  # what the prompt check keeps (the same record objects)
    task.keep_records(task.train_records()[:5], kept)
    assert task.validation_records() == validation[1:] and task.test_records() == test[:-2]
    assert len(task.train_records()) == 5
