"""Every checkpoint of a run scored the same way (issue 59 §3, lit_grpo.run.sweep): which checkpoints a stride picks,
the table written from the evaluations file (by hand), a real sweep of a short quickstart run through the command's
validate (its checkpoints named with their steps, the base model beside them), the pictures' points by hand and
their TensorBoard images, and a checkpoint of another base model refused by validate before any weights load."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from lit_grpo.errors import InputError
from lit_grpo.run.evaluation_plots import base_value, interval, pass_at_k_points, run_points, step_series
from lit_grpo.run.evaluation_table import csv_table, markdown_table
from lit_grpo.run.resume import check_resume, same_model
from lit_grpo.run.sweep import SavedCheckpoint, saved_checkpoints, strided, sweep

ROOT = Path(__file__).resolve().parents[1]


def line(checkpoint, step, metric, value, stderr=None, evaluated_set="val"):
    return {"set": evaluated_set, "metric": metric, "value": value, "stderr": stderr, "n": 1, "k": None,
            "seed": None, "checkpoint": checkpoint, "stage": "validate", "step": step}


# --- which checkpoints, by hand ---------------------------------------------------------------------------------------
def test_a_stride_takes_every_mth_checkpoint_and_the_last_always():
    ten = [SavedCheckpoint(Path(f"epoch={i}-step={2 * i}.ckpt"), 2 * i) for i in range(10)]
    assert [c.step for c in strided(ten, 3)] == [4, 10, 16, 18]  # the 3rd, 6th, 9th and the 10th
    assert [c.step for c in strided(ten, 1)] == [2 * i for i in range(10)]
    assert [c.step for c in strided(ten, 5)] == [8, 18]
    assert [c.step for c in strided(ten, 20)] == [18]
    with pytest.raises(InputError, match=r"--stride: must be >= 1 \(every m-th checkpoint\), got 0"):
        strided(ten, 0)


def test_the_checkpoints_of_a_run_by_step_a_link_and_a_repeated_step_counted_once(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("epoch=0-step=2.ckpt", "epoch=2-step=6.ckpt", "epoch=1-step=4.ckpt"):
        (folder / name).write_bytes(b"")  # named: the step is read from the name
    (folder / "last.ckpt").symlink_to(folder / "epoch=2-step=6.ckpt")  # save_top_k -1's link to the newest
    (folder / ".epoch=3-step=8.ckpt.partial-7").write_bytes(b"")  # a write killed half-way
    assert [(c.path.name, c.step) for c in saved_checkpoints(tmp_path)] == [
        ("epoch=0-step=2.ckpt", 2), ("epoch=1-step=4.ckpt", 4), ("epoch=2-step=6.ckpt", 6)]
    (folder / "last.ckpt").unlink()
    torch.save({"global_step": 6, "state_dict": {}}, folder / "last.ckpt")  # save_last: true beside a top k
    torch.save({"global_step": 9, "state_dict": {}}, tmp_path / "last.ckpt")  # the command's one file
    assert [c.step for c in saved_checkpoints(folder)] == [2, 4, 6]
    assert saved_checkpoints(folder)[-1].path.name == "epoch=2-step=6.ckpt"
    assert [(c.path.name, c.step) for c in saved_checkpoints(tmp_path / "nothing")] == []
    (tmp_path / "checkpoints").rename(tmp_path / "kept")
    assert [(c.path.name, c.step) for c in saved_checkpoints(tmp_path)] == [("last.ckpt", 9)]


# --- the table, by hand ---------------------------------------------------------------------------------------------
def test_the_table_has_a_row_per_checkpoint_and_a_cell_per_set_and_metric():
    lines = [line("runs/c/epoch=1-step=4.ckpt", 4, "accuracy", 0.25), line("runs/c/epoch=1-step=4.ckpt", 4, "mean@4",
                                                                          0.5, 0.125),
             line("base", 0, "accuracy", 0.125), line("base", 0, "mean@4", 0.375, 0.0625),
             line("runs/c/epoch=0-step=2.ckpt", 2, "accuracy", 0.0),
             line("runs/c/epoch=1-step=4.ckpt", 4, "accuracy", 0.5),  # scored again: the newest stands
             line("base", 0, "accuracy", 0.75, evaluated_set="test"), line("base", 0, "maj@4", None)]
    assert markdown_table(lines) == (
        "| checkpoint | step | val/accuracy | val/mean@4 | test/accuracy | val/maj@4 |\n"
        "|---|---|---|---|---|---|\n"
        "| base | 0 | 0.1250 | 0.3750 ± 0.0625 | 0.7500 | n/a |\n"
        "| epoch=0-step=2.ckpt | 2 | 0.0000 |  |  |  |\n"
        "| epoch=1-step=4.ckpt | 4 | 0.5000 | 0.5000 ± 0.1250 |  |  |\n")
    rows = list(csv.reader(io.StringIO(csv_table(lines))))
    assert rows == [
        ["checkpoint", "step", "val/accuracy", "val/accuracy_stderr", "val/mean@4", "val/mean@4_stderr",
         "test/accuracy", "test/accuracy_stderr", "val/maj@4", "val/maj@4_stderr"],
        ["base", "0", "0.125", "", "0.375", "0.0625", "0.75", "", "", ""],
        ["runs/c/epoch=0-step=2.ckpt", "2", "0.0", "", "", "", "", "", "", ""],
        ["runs/c/epoch=1-step=4.ckpt", "4", "0.5", "", "0.5", "0.125", "", "", "", ""]]


# --- the pictures' points, by hand ------------------------------------------------------------------------------------
def test_the_pictures_points_by_hand():
    assert pass_at_k_points({"pass@4": 0.7, "pass@1": 0.3, "mean@4": 0.2, "pass@2": 0.5}) == [(1, 0.3), (2, 0.5),
                                                                                              (4, 0.7)]
    training = [dict(line("training", step, "accuracy", value), stage="fit")
                for step, value in ((0, 0.1), (4, 0.3), (2, 0.2), (4, 0.35))]  # step 4 twice: a resumed run
    assert step_series(training, "val", "accuracy") == [(0, 0.1), (2, 0.2), (4, 0.35)]
    assert step_series(training, "test", "accuracy") == []
    assert base_value(training, "val", "accuracy") == (0.1, "step 0")  # no evaluate_base: the step-0 validation
    assert base_value([*training, line("base", 0, "accuracy", 0.05)], "val", "accuracy") == (0.05, "base model")
    assert base_value(training[1:], "val", "accuracy") == (None, "")
    low, high = interval(0.5, 0.1)
    assert (round(low, 12), round(high, 12)) == (0.304, 0.696)
    assert interval(0.5, None) == (0.5, 0.5)
    swept = [line("a.ckpt", 2, "mean@4", 0.5, 0.1), line("base", 0, "mean@4", 0.2, 0.1), line("b.ckpt", 4, "mean@4",
                                                                                               0.25)]
    points = [(s, v, round(lo, 12), round(hi, 12)) for s, v, lo, hi in run_points(swept, "val", "mean@4")]
    assert points == [(2, 0.5, 0.304, 0.696), (4, 0.25, 0.25, 0.25)]  # the base model is its line, not a point


# --- a checkpoint of another base model ---------------------------------------------------------------------------
def test_one_model_under_two_names_and_two_models(tmp_path):
    assert same_model("data/tiny-llama", "data/tiny-llama") is True
    assert same_model("data/tiny-llama", str(ROOT / "data" / "tiny-llama")) is True  # resolved in the checkout
    assert same_model("data/tiny-llama", "data/tiny-llama-clarify") is False  # same shapes, another model
    assert same_model(str(tmp_path / "moved-away"), "data/tiny-llama") is None  # cannot be told: shapes decide
    assert same_model("someone/some-model", "data/tiny-llama") is None  # a hub id


def crafted(path: Path, model: str, state: dict) -> Path:
    torch.save({"state_dict": state, "global_step": 3, "hyper_parameters": {  # as written before the knob groups
        "model_name_or_path": model, "lora_rank": 4, "lora_target_modules": "all-linear"}}, path)
    return path


def test_validate_refuses_a_checkpoint_of_another_base_model_by_its_name_or_its_shapes(tmp_path):
    current = {"model_name_or_path": "data/tiny-llama-clarify", "lora": {"rank": 4, "target_modules": "all-linear"}}
    other = crafted(tmp_path / "other.ckpt", "data/tiny-llama", {})
    with pytest.raises(InputError) as refused:
        check_resume(str(other), current)  # no task: validate / test
    assert str(refused.value) == (
        f"cannot evaluate {str(other)!r}: it was trained on 'data/tiny-llama' (its hyper_parameters' "
        "model_name_or_path), this run loads model.model_name_or_path 'data/tiny-llama-clarify', another model: "
        "evaluate it with --model.model_name_or_path data/tiny-llama, or pass a checkpoint trained on "
        "'data/tiny-llama-clarify'")
    moved = crafted(tmp_path / "moved.ckpt", str(tmp_path / "gone"), {
        "policy.base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": torch.zeros(4, 256)})
    current["model_name_or_path"] = "data/tiny-qwen2-chat"
    with pytest.raises(InputError) as refused:
        check_resume(str(moved), current)  # its model is nowhere here: the shapes tell
    assert str(refused.value).startswith(f"cannot evaluate {str(moved)!r}: it was trained on {str(tmp_path / 'gone')!r}"
                                         " and its adapter does not fit this run's model.model_name_or_path "
                                         "'data/tiny-qwen2-chat': ")
    assert str(refused.value).endswith(f"Evaluate it with --model.model_name_or_path {tmp_path / 'gone'}, or pass a "
                                       "checkpoint trained on 'data/tiny-qwen2-chat'")


# --- a real run, swept ---------------------------------------------------------------------------------------------
QUICK = ["--trainer.max_epochs", "3", "--trainer.check_val_every_n_epoch", "1", "--data.prompts_per_epoch", "2",
         "--data.group_size", "2", "--data.minibatch_size", "4", "--data.val_max_prompts", "4",
         "--data.evaluation.samples", "2", "--data.evaluation.k", "[1, 2]", "--checkpoint.save_top_k", "-1",
         "--trainer.enable_progress_bar", "false", "--metrics.table_every_n_epochs", "0",
         "--model.optimizer.init_args.lr", "0.05"]  # a large step: each epoch's adapter answers otherwise


def in_process(arguments: list[str]) -> int:
    """``lit-grpo <arguments>`` in this process: its exit code."""
    from lit_grpo.cli import main

    try:
        main(list(arguments))
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    """Three epochs of the quickstart, every epoch's checkpoint kept, a sampled validation after each: its
    ``runs/quickstart/version_0`` directory."""
    root = tmp_path_factory.mktemp("sweep-run")
    here = Path.cwd()
    os.chdir(root)  # the quickstart logs to runs/quickstart
    try:
        assert in_process(["fit", "--config", str(ROOT / "configs" / "quickstart.yaml"), *QUICK]) == 0
    finally:
        os.chdir(here)
    return root / "runs" / "quickstart" / "version_0"


@pytest.mark.slow
def test_a_runs_validations_draw_pass_at_k_and_each_figure_over_the_steps(quick_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = quick_run.glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
    accumulator.Reload()
    assert {"val/pass@k", "val/over_steps"} <= set(accumulator.Tags()["images"])
    assert [event.step for event in accumulator.Images("val/over_steps")] == [0, 1, 2, 3]  # each validation
    lines = [json.loads(text) for text in (quick_run / "evaluations.jsonl").read_text().splitlines()]
    assert sorted({line["step"] for line in lines}) == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_sweep_scores_every_mth_checkpoint_and_the_base_model_into_one_table(quick_run, tmp_path, capsys):
    run = Path(shutil.copytree(quick_run, tmp_path / "run", symlinks=True))
    assert [c.path.name for c in saved_checkpoints(run)] == ["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt",
                                                             "epoch=2-step=3.ckpt"]
    result = sweep(run, stride=2, base=True, validate=in_process,
                   extra=["--trainer.enable_progress_bar", "false"])
    said = [text for text in capsys.readouterr().err.splitlines() if text.startswith("sweep:")]
    assert said[:4] == [f"sweep: 2 of 3 checkpoint(s) (stride 2) and the base model, logged to {run / 'sweep'}",
                        "sweep: [1/3] base model", "sweep: [2/3] epoch=1-step=2.ckpt (step 2)",
                        "sweep: [3/3] epoch=2-step=3.ckpt (step 3)"]
    lines = [json.loads(text) for text in result.evaluations.read_text().splitlines()]
    checkpoints = run / "checkpoints"
    assert list(dict.fromkeys((line["checkpoint"], line["step"]) for line in lines)) == [
        ("base", 0), (str(checkpoints / "epoch=1-step=2.ckpt"), 2), (str(checkpoints / "epoch=2-step=3.ckpt"), 3)]
    metrics = {line["metric"] for line in lines}
    assert {"accuracy", "reward", "mean@2", "pass@1", "pass@2"} <= metrics
    table = list(csv.DictReader(result.csv.open()))
    assert [(row["checkpoint"], row["step"]) for row in table] == [(line[0], str(line[1])) for line in (
        ("base", 0), (str(checkpoints / "epoch=1-step=2.ckpt"), 2), (str(checkpoints / "epoch=2-step=3.ckpt"), 3))]
    for row, (name, step) in zip(table, (("base", 0), ("epoch=1-step=2.ckpt", 2), ("epoch=2-step=3.ckpt", 3))):
        mine = {line["metric"]: line for line in lines if line["step"] == step}
        assert float(row["val/mean@2"]) == mine["mean@2"]["value"]
        assert float(row["val/mean@2_stderr"]) == mine["mean@2"]["stderr"]
    markdown = result.markdown.read_text().splitlines()
    assert markdown[0].startswith("| checkpoint | step | val/reward | val/accuracy | val/failed | val/length |")
    assert [text.split(" | ")[0:2] for text in markdown[2:]] == [["| base", "0"], ["| epoch=1-step=2.ckpt", "2"],
                                                                 ["| epoch=2-step=3.ckpt", "3"]]
    assert result.picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a checkpoint validated scores what the fit's validation scored at its step (its weights, the same prompts)
    fit_lines = [json.loads(text) for text in (run / "evaluations.jsonl").read_text().splitlines()]
    at = {(line["step"], line["metric"]): line["value"] for line in fit_lines}
    swept = {(line["step"], line["metric"]): line["value"] for line in lines}
    assert swept[(3, "accuracy")] == at[(3, "accuracy")] and swept[(2, "reward")] == at[(2, "reward")]


@pytest.mark.slow
def test_validate_refuses_a_checkpoint_of_another_model_with_the_same_shapes(quick_run, tmp_path, capsys):
    import lightning.pytorch as pl

    from lit_grpo.callbacks import RolloutMetrics
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.tasks import ArithmeticTask

    checkpoint = quick_run / "checkpoints" / "epoch=2-step=3.ckpt"
    code = in_process(["validate", "--config", str(quick_run / "config.yaml"), "--ckpt_path", str(checkpoint),
                       "--model.model_name_or_path", "data/tiny-llama-clarify", "--trainer.logger", "false",
                       "--trainer.default_root_dir", str(tmp_path / "command")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert (f"lit-grpo: cannot evaluate {str(checkpoint)!r}: it was trained on 'data/tiny-llama' (its "
            "hyper_parameters' model_name_or_path), this run loads model.model_name_or_path "
            "'data/tiny-llama-clarify', another model") in err
    # the Python API: Lightning names the checkpoint only once the model is built; refused as it loads, before any
    # prompt is evaluated
    module = PolicyModule(model_name_or_path="data/tiny-llama-clarify", lora={"rank": 16})
    data = RolloutDataModule(task=ArithmeticTask(), val_max_prompts=4)
    trainer = pl.Trainer(default_root_dir=tmp_path / "python", logger=False, enable_progress_bar=False,
                         callbacks=[RolloutMetrics()])
    with pytest.raises(InputError, match="cannot evaluate .* it was trained on 'data/tiny-llama'"):
        trainer.validate(module, datamodule=data, ckpt_path=str(checkpoint))
    assert not (tmp_path / "python" / "evaluations.jsonl").exists()


def test_the_benchmark_draws_several_runs_with_their_intervals(tmp_path, capsys):
    from benchmarks.learning import evaluation_plot
    from lit_grpo.run.evaluation_plots import runs_figure

    first, second = tmp_path / "first", tmp_path / "second"
    for folder, values in ((first, (0.25, 0.5)), (second, (0.375, 0.625))):
        folder.mkdir()
        lines = [line("base", 0, "mean@4", 0.125, 0.05),
                 *(dict(line("training", step, "mean@4", value, 0.1), stage="fit") for step, value in
                   zip((2, 4), values)), dict(line("training", 4, "accuracy", 0.5), stage="fit")]
        (folder / "evaluations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "plot.png"
    assert evaluation_plot.main([str(first), str(second / "evaluations.jsonl"), "--panel", "val/mean@4",
                                 "--panel", "val/accuracy", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out == f"wrote {out}: 2 run(s), 2 panel(s)\n"
    runs = {"a": [json.loads(x) for x in (first / "evaluations.jsonl").read_text().splitlines()]}
    axes = runs_figure(runs, [("val", "mean@4")]).axes[0]
    (bars,) = axes.containers
    segments = [[tuple(round(v, 12) for v in point) for point in segment] for segment in bars.lines[2][0].get_segments()]
    assert segments == [[(2.0, 0.054), (2.0, 0.446)], [(4.0, 0.304), (4.0, 0.696)]]  # value ± 1.96 · 0.1
    assert [tuple(line.get_ydata()) for line in axes.lines if line.get_linestyle() == "--"] == [(0.125, 0.125)]
    with pytest.raises(SystemExit):
        evaluation_plot.main([str(first), "--panel", "val/pass@8", "--out", str(out)])
    assert "no figure for val/pass@8 in these runs; found: val/accuracy, val/mean@4" in capsys.readouterr().err
