"""Named evaluation sets (issue 59 §2, docs/guide.md#named-evaluation-sets): ``data.eval_sets`` scores several sets
at a validation, each logged as ``val/<set>/...`` at its own interval and written to evaluations.jsonl under its name;
bad sets are refused with one message listing every problem, exit 2, before any weights load."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_grpo.callbacks.evaluations import by_set
from lit_grpo.policy.evaluation import GreedyEvaluation
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.eval_sets import (EvalSet, due_sets, eval_sets_data_problems, eval_sets_problems,
                                        named_sets)
from lit_grpo.rollout.sampled import SampledEvaluation
from lit_grpo.tasks import ArithmeticTask
from support import weight_reads

ROOT = Path(__file__).resolve().parents[1]
ONE_DIGIT = "data/addition-eval/one-digit.jsonl"


def write_rows(path: Path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "0"}) + "\n" for p in prompts) or "\n\n")
    return str(path)


def test_the_shipped_one_digit_file_shares_no_prompt_with_the_quickstarts_training():
    rows = [json.loads(line) for line in (ROOT / ONE_DIGIT).read_text().splitlines()]
    assert len(rows) == 48 and len({row["prompt"] for row in rows}) == 48
    assert all(str(int(a) + int(b)) == row["answer"] for row in rows for a, b in [row["prompt"][:-1].split("+")])
    assert eval_sets_data_problems(ArithmeticTask(), [{"name": "one_digit", "source": ONE_DIGIT}]) == []


def test_the_list_and_the_mapping_form_give_the_same_sets():
    listed = named_sets([{"name": "a", "source": ONE_DIGIT, "evaluation": {"samples": 4, "k": [1, 4]}},
                         EvalSet(name="b", every_n_epochs=2)])
    mapped = named_sets({"a": {"source": ONE_DIGIT, "evaluation": {"samples": 4, "k": [1, 4]}},
                         "b": {"every_n_epochs": 2}})
    assert listed == mapped == [EvalSet("a", ONE_DIGIT, evaluation=SampledEvaluation(samples=4, k=[1, 4])),
                                EvalSet("b", every_n_epochs=2)]
    assert named_sets(None) == []


def test_every_problem_of_the_sets_as_written_is_listed_at_once(tmp_path):
    sets = [{"name": "a", "source": "validation"},
            {"name": "a", "source": str(tmp_path / "missing.jsonl")},
            {"name": "b/c", "evaluation": {"samples": 4, "k": [1, 8]}, "every_n_epochs": 0},
            {"name": "d", "source": "README.md", "max_prompts": 0, "overlap_ok": True}]
    assert eval_sets_problems(sets) == [
        "eval_sets[2].evaluation.k: each k of pass@k must be within 1..samples (4), got [1, 8]: lower k or raise "
        "evaluation.samples",
        "eval_sets[3]: unknown field(s) overlap_ok; fields: name, source, split, evaluation, max_prompts, "
        "every_n_epochs, overlap, task",
        "eval_sets[1].name: 'a' names eval_sets[0] too: give each set its own name",
        f"eval_sets[1].source: {str(tmp_path / 'missing.jsonl')!r} is neither a split (validation or test) nor an "
        "existing data file: give the file's path (relative to where you run, or to the checkout)",
        "eval_sets[2].name: 'b/c': give each set a name of letters, digits, _ and - (it becomes val/<name>/...)",
        "eval_sets[2].every_n_epochs: must be >= 1, got 0",
        "eval_sets[3].source: 'README.md' is not a data file lit-grpo reads (.jsonl, .json, .parquet, .csv, .arrow)",
        "eval_sets[3].max_prompts: must be >= 1 or None (every prompt), got 0",
    ]
    assert eval_sets_problems({"a": {"source": "test"}, "b": {"source": ONE_DIGIT}}) == []


def test_an_empty_set_and_sets_overlapping_training_are_refused_unless_overlap_is_allowed(tmp_path):
    task = ArithmeticTask()
    trained = [r["prompt"] for r in task.train_records()[:3]]
    sets = [{"name": "empty", "source": write_rows(tmp_path / "empty.jsonl", [])},
            {"name": "leaky", "source": write_rows(tmp_path / "leaky.jsonl", ["1+2=", *trained])},
            {"name": "allowed", "source": str(tmp_path / "leaky.jsonl"), "overlap": "allowed"},
            {"name": "held", "source": "validation"}, {"name": "test", "source": "test"}]
    assert eval_sets_data_problems(task, sets) == [
        "data.eval_sets[empty]: the set holds no prompt ('" + str(tmp_path / "empty.jsonl") + "'): give it prompts, "
        "or drop the set",
        f"data.eval_sets[leaky]: 3 of its prompts are training prompts (e.g. {trained[0]!r}): a score on them is no "
        "held-out score; remove them, or say overlap: allowed",
    ]


def test_a_set_is_due_at_the_validations_ending_a_multiple_of_its_epochs():
    sets = [SimpleNamespace(every_n_epochs=1), SimpleNamespace(every_n_epochs=2), SimpleNamespace(every_n_epochs=3)]
    at = lambda fn, epoch: [s.every_n_epochs for s in due_sets(sets, SimpleNamespace(  # noqa: E731
        state=SimpleNamespace(fn=fn), current_epoch=epoch))]
    assert [at("fit", epoch) for epoch in range(6)] == [[1], [1, 2], [1, 3], [1, 2], [1], [1, 2, 3]]
    assert at("validate", 0) == [1, 2, 3] and due_sets(sets, None) == sets


def test_each_sets_batches_are_accumulated_apart_and_named():
    evaluation = GreedyEvaluation()
    evaluation.update({"set": "a", "reward": torch.tensor([1.0, 0.0]), "correct": torch.tensor([True, False])})
    evaluation.update({"set": "b", "reward": torch.tensor([0.5]), "correct": torch.tensor([False]),
                       "pass@2": torch.tensor([0.75])})
    evaluation.update({"set": "a", "reward": torch.tensor([1.0, 1.0]), "correct": torch.tensor([True, True])})
    assert evaluation.compute() == {"a/reward": 0.75, "a/accuracy": 0.75, "b/reward": 0.5, "b/accuracy": 0.0,
                                    "b/pass@2": 0.75}
    evaluation.update({"set": "b", "reward": torch.tensor([0.25]), "correct": torch.tensor([True]),
                       "pass@2": torch.tensor([1.0])})
    assert evaluation.compute() == {"b/reward": 0.25, "b/accuracy": 1.0, "b/pass@2": 1.0}  # a had no batch this time
    evaluation.update({"reward": torch.tensor([0.5, 0.0]), "correct": torch.tensor([True, False])})
    assert evaluation.compute() == {"reward": 0.25, "accuracy": 0.5}  # no set: today's figures, alone
    assert by_set({"accuracy": 1.0, "b/pass@2": 0.5, "b/mean@2_stderr": 0.1}) == {
        None: {"accuracy": 1.0}, "b": {"pass@2": 0.5, "mean@2_stderr": 0.1}}


def test_each_set_is_a_loader_of_its_own_prompts_with_its_own_evaluation(monkeypatch):
    task = ArithmeticTask(heldout_size=40)
    data = RolloutDataModule(task=task, group_size=2, prompts_per_epoch=2, minibatch_size=4, val_batch_size=3,
                             evaluation={"samples": 2, "k": [1]},
                             eval_sets={"held": {"max_prompts": 5}, "digits": {"source": ONE_DIGIT, "max_prompts": 4,
                                                                              "evaluation": {"samples": 3, "k": [3]}}})
    asked = []

    def scored(module, records, prompts):
        asked.append((prompts.name, prompts.evaluation and prompts.evaluation.samples, [r["prompt"] for r in records]))
        return torch.zeros(len(records)), torch.zeros(len(records), dtype=torch.bool)

    monkeypatch.setattr(data, "checked_module", lambda: None)
    monkeypatch.setattr(data, "greedy_scores", scored)
    batches = list(data.held_out_scores())
    digits = [json.loads(line)["prompt"] for line in (ROOT / ONE_DIGIT).read_text().splitlines()[:4]]
    held = [r["prompt"] for r in task.validation_records()[:5]]
    assert asked == [("held", 2, held[:3]), ("held", 2, held[3:]), ("digits", 3, digits[:3]), ("digits", 3, digits[3:])]
    assert [batch["set"] for batch in batches] == ["held", "held", "digits", "digits"]
    plain = RolloutDataModule(task=task, group_size=2, prompts_per_epoch=2, minibatch_size=4, val_batch_size=3)
    monkeypatch.setattr(plain, "checked_module", lambda: None)
    monkeypatch.setattr(plain, "greedy_scores", scored)
    asked.clear()
    loader = plain.val_dataloader()  # without eval_sets: one loader of the validation split, batches as always
    assert isinstance(loader, torch.utils.data.DataLoader) and [sorted(batch) for batch in loader] == [
        ["correct", "reward"]] * 7 and [len(prompts) for _, _, prompts in asked] == [3] * 6 + [2]


def refused(main, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err, err
    return err


def sets_flag(sets: list[dict]) -> list[str]:
    return ["--data.eval_sets", json.dumps(sets)]


@pytest.mark.slow
def test_the_command_refuses_bad_sets_with_one_message_each_before_any_weights_load(tmp_path, monkeypatch, capsys):
    from lit_grpo.cli import main

    reads = weight_reads(monkeypatch)
    base = ["validate", "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path)]
    missing = str(tmp_path / "missing.jsonl")
    err = refused(main, base + sets_flag([{"name": "a", "source": ONE_DIGIT},
                                          {"name": "a", "source": missing, "evaluation": {"samples": 2, "k": [4]}}]),
                  capsys)
    for message in ("data.eval_sets[1].name: 'a' names eval_sets[0] too",
                    f"data.eval_sets[1].source: {missing!r} is neither a split",
                    "data.eval_sets[1].evaluation.k: each k of pass@k must be within 1..samples (2), got [4]"):
        assert message in err, err
    trained = ArithmeticTask().train_records()[0]["prompt"]
    err = refused(main, base + sets_flag([{"name": "empty", "source": write_rows(tmp_path / "empty.jsonl", [])},
                                          {"name": "leaky", "source": write_rows(tmp_path / "leaky.jsonl", [trained])},
                                          {"name": "fine", "source": ONE_DIGIT}]), capsys)
    assert "data.eval_sets[empty]: the set holds no prompt" in err and "data.eval_sets[fine]" not in err
    assert f"data.eval_sets[leaky]: 1 of its prompts are training prompts (e.g. {trained!r})" in err
    assert reads == []  # both refused before any weights were read


@pytest.mark.slow
def test_a_fit_logs_each_set_under_its_name_at_its_interval_and_writes_both_to_the_evaluations_file(tmp_path,
                                                                                                   monkeypatch):
    from lit_grpo.cli import main

    monkeypatch.chdir(tmp_path)
    sets = [{"name": "held", "source": "validation", "max_prompts": 4},
            {"name": "digits", "source": ONE_DIGIT, "max_prompts": 3, "every_n_epochs": 2,
             "evaluation": {"samples": 2, "k": [1, 2], "seed": 1}}]
    main(["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.max_epochs", "2",
          "--trainer.check_val_every_n_epoch", "1", "--trainer.num_sanity_val_steps", "0",
          "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "runs", "--trainer.enable_progress_bar", "false",
          "--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
          "--trainer.enable_checkpointing", "false", *sets_flag(sets)])
    (run,) = (tmp_path / "runs").glob("*/version_*")
    with (run / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    logged = sorted(name for row in rows for name, value in row.items() if value and name.startswith("val"))
    digits = ["accuracy", "failed", "length", "maj@2", "mean@2", "mean@2_stderr", "pass@1", "pass@2", "reward"]
    # held: before training and after each epoch; digits: after the second epoch only (every_n_epochs 2)
    assert logged == [f"val/digits/{name}" for name in digits] + ["val/held/accuracy"] * 3 + ["val/held/reward"] * 3
    lines = [json.loads(line) for line in (run / "evaluations.jsonl").read_text().splitlines()]
    # the validation before training too (step 0), as the logged figures above
    assert {(line["set"], line["step"]) for line in lines} == {("held", 0), ("held", 1), ("held", 2), ("digits", 2)}
    assert {(line["metric"], line["n"], line["k"], line["seed"]) for line in lines if line["set"] == "digits"} >= {
        ("pass@2", 2, 2, 1), ("accuracy", 1, None, None)}


@pytest.mark.slow
def test_a_set_with_its_own_task_is_scored_by_that_task_as_a_validation_of_it_alone(tmp_path, monkeypatch):
    """The sort task's validation prompts as a set of a quickstart validation (its own task, its own rewards) give
    the figures a validation with the sort task as data.task gives, on the same base model."""
    from lit_grpo.cli import main

    monkeypatch.chdir(tmp_path)
    sort_task = {"class_path": "lit_grpo.tasks.SortTask",
                 "init_args": {"rewards": ["sort_distance", "inclusion_ordering"], "reward_weights": [1.0, 0.5]}}
    common = ["validate", "--config", str(ROOT / "configs/quickstart.yaml"), "--model.evaluate_base", "true",
              "--trainer.logger", "CSVLogger", "--trainer.enable_progress_bar", "false"]
    main([*common, "--trainer.logger.save_dir", "sets", *sets_flag(
        [{"name": "sums", "source": "validation", "max_prompts": 6},
         {"name": "sorting", "source": "validation", "max_prompts": 6, "task": sort_task}])])
    main([*common, "--trainer.logger.save_dir", "alone", "--data.task", json.dumps(sort_task),
          "--data.val_max_prompts", "6"])

    def logged(folder: str) -> dict[str, float]:
        (path,) = (tmp_path / folder).glob("*/version_*/metrics.csv")
        with path.open() as handle:
            return {k: float(v) for row in csv.DictReader(handle) for k, v in row.items() if v and k.startswith("val")}

    sets, alone = logged("sets"), logged("alone")
    assert {k for k in sets if k.startswith("val/sorting/")} == {"val/sorting/accuracy", "val/sorting/reward"}
    assert sets["val/sorting/reward"] == alone["val/reward"] and sets["val/sorting/accuracy"] == alone["val/accuracy"]
    assert sets["val/sums/reward"] != sets["val/sorting/reward"]  # the quickstart's own reward scored the other set


def test_a_sets_task_that_cannot_be_built_is_named():
    problems = eval_sets_problems([{"name": "a", "source": "validation",
                                    "task": {"class_path": "lit_grpo.tasks.NoSuchTask"}}])
    assert len(problems) == 1 and problems[0].startswith("eval_sets[0].task: "), problems
    assert "data.task" in problems[0]
