"""Evaluating the base model and an adapter (issue 59 §3): ``model.evaluate_base`` scores exactly the base model, it is
refused beside an adapter, a checkpoint or fit, and every validation and test appends its figures to
``<log_dir>/evaluations.jsonl``, which the ``json`` module reads alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.callbacks.evaluations import evaluated_weights, evaluation_lines, figure_fields
from lit_grpo.cli.config_check import config_problems
from lit_grpo.errors import InputError
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.sampled import SampledEvaluation
from lit_grpo.tasks import ArithmeticTask
from support import DigitShareTask, save_lora_adapter

ROOT = Path(__file__).resolve().parents[1]
TINY_LLAMA = ROOT / "data" / "tiny-llama"  # the shipped one: its greedy sums differ from prompt to prompt
PROMPTS = 16
QUIET = {"enable_progress_bar": False, "enable_model_summary": False}
BASE_REFUSED = "evaluate_base: true scores the base model, without"


class RecordingTask(ArithmeticTask):
    """``ArithmeticTask`` keeping every completion text it scores, in order (the hf engine scores in this process)."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def reward(self, prompt_record, completion_text: str, completion_ids: Sequence[int]) -> float:
        self.texts.append(completion_text)
        return super().reward(prompt_record, completion_text, completion_ids)


def plain_greedy_texts(model_dir: Path, task: RecordingTask, records: list, max_new_tokens: int) -> list[str]:
    """The greedy completions of a plain transformers model (no PEFT anywhere), as the task reads them."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts = []
    for record in records:
        ids = torch.tensor([task.prompt_ids(record, tokenizer)])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[0, ids.shape[1]:].tolist()
        new = new[:new.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in new else new
        texts.append(tokenizer.decode(new, skip_special_tokens=True).strip())
    return texts


def validate(model_dir: Path, root: Path, task: RecordingTask, **module_args) -> dict[str, float]:
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 4}, dtype="float32", **module_args)
    data = RolloutDataModule(task=task, prompts_per_epoch=4, group_size=2, minibatch_size=4, max_new_tokens=6,
                             val_max_prompts=PROMPTS, val_batch_size=PROMPTS)
    trainer = pl.Trainer(default_root_dir=root, logger=False, callbacks=[RolloutMetrics(0)], **QUIET)
    return trainer.validate(module, datamodule=data, verbose=False)[0]


def test_the_base_models_greedy_answers_through_validate_are_a_plain_transformers_models(tmp_path):
    task = RecordingTask()
    metrics = validate(TINY_LLAMA, tmp_path, task, evaluate_base=True)
    records = RolloutDataModule(task=task, val_max_prompts=PROMPTS).val_records()
    plain = plain_greedy_texts(TINY_LLAMA, task, records, 6)
    assert len(task.texts) == PROMPTS and task.texts == plain
    right = sum(text == record["answer"] for text, record in zip(plain, records))
    assert 0 < right < PROMPTS  # the comparison can tell answers apart
    lines = [json.loads(line) for line in (tmp_path / "evaluations.jsonl").read_text().splitlines()]
    accuracy = next(line for line in lines if line["metric"] == "accuracy")
    assert accuracy["value"] == right / PROMPTS == metrics["val/accuracy"]  # a sum of 0/1 over 16: exact in float32
    assert {(line["set"], line["checkpoint"], line["stage"], line["n"], line["k"], line["seed"]) for line in lines} == {
        ("val", "base", "validate", 1, None, None)}
    assert sorted(line["metric"] for line in lines) == ["accuracy", "reward"]


def test_an_adapter_directory_is_evaluated_and_named(tmp_path):
    # a large B: its greedy answers are not the base model's
    save_lora_adapter(TINY_LLAMA, tmp_path / "adapter", lambda b: b.normal_(0, 1.0))
    task = RecordingTask()
    validate(TINY_LLAMA, tmp_path / "run", task, init_adapter=str(tmp_path / "adapter"))
    records = RolloutDataModule(task=task, val_max_prompts=PROMPTS).val_records()
    assert task.texts != plain_greedy_texts(TINY_LLAMA, task, records, 6)
    lines = [json.loads(line) for line in (tmp_path / "run" / "evaluations.jsonl").read_text().splitlines()]
    assert {line["checkpoint"] for line in lines} == {str(tmp_path / "adapter")}


def test_evaluate_base_is_refused_beside_an_adapter_a_checkpoint_or_fit(tiny_llama_dir, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 16, "target_modules": ["q_proj"]}))
    with pytest.raises(InputError, match="model.init_adapter .* gives one: drop one of the two"):
        PolicyModule(model_name_or_path=str(tiny_llama_dir), evaluate_base=True, init_adapter=str(adapter))
    problems = config_problems({"model": {"evaluate_base": True}, "ckpt_path": "runs/last.ckpt"})
    assert problems == ["model.evaluate_base: true scores the base model, without a checkpoint; ckpt_path "
                        "'runs/last.ckpt' gives one: drop one of the two (a checkpoint is evaluated with ckpt_path "
                        "alone)"]
    assert config_problems({"model": {"evaluate_base": True}}) == []
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), evaluate_base=True)
    data = RolloutDataModule(task=DigitShareTask(), prompts_per_epoch=2, group_size=2, minibatch_size=4)
    trainer = pl.Trainer(default_root_dir=tmp_path, logger=False, max_epochs=1, reload_dataloaders_every_n_epochs=1,
                         **QUIET)
    with pytest.raises(InputError, match="evaluate_base: true is for lit-grpo validate and test"):
        trainer.fit(module, datamodule=data)
    assert module.policy is None  # refused before the model loaded


def test_each_figure_is_one_line_with_its_n_k_seed_and_stderr():
    spec = SampledEvaluation(samples=8, k=[1, 4], seed=3)
    metrics = {"reward": 0.25, "accuracy": 0.5, "mean@8": 0.375, "mean@8_stderr": 0.125, "pass@1": 0.5,
               "pass@4": 0.75, "maj@8": float("nan")}
    about = {"checkpoint": "base", "stage": "test"}
    lines = [json.loads(json.dumps(line, allow_nan=False)) for line in evaluation_lines("test", metrics, spec, about)]
    assert lines == [
        {"set": "test", "metric": "reward", "value": 0.25, "stderr": None, "n": 1, "k": None, "seed": None, **about},
        {"set": "test", "metric": "accuracy", "value": 0.5, "stderr": None, "n": 1, "k": None, "seed": None, **about},
        {"set": "test", "metric": "mean@8", "value": 0.375, "stderr": 0.125, "n": 8, "k": None, "seed": 3, **about},
        {"set": "test", "metric": "pass@1", "value": 0.5, "stderr": None, "n": 8, "k": 1, "seed": 3, **about},
        {"set": "test", "metric": "pass@4", "value": 0.75, "stderr": None, "n": 8, "k": 4, "seed": 3, **about},
        {"set": "test", "metric": "maj@8", "value": None, "stderr": None, "n": 8, "k": None, "seed": 3, **about},
    ]
    assert figure_fields("pass@12", SampledEvaluation(samples=16, k=[12], seed=7)) == (16, 12, 7)
    assert figure_fields("accuracy", None) == (1, None, None)


def test_what_was_evaluated_is_named():
    zero, trained = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    for layer, value in ((zero, 0.0), (trained, 0.5)):
        layer.lora_B = torch.nn.Parameter(torch.full((2, 2), value))
    assert evaluated_weights("fit", None, None, 3, trained) == "training"
    assert evaluated_weights("validate", "runs/last.ckpt", "adapter", 0, trained) == "runs/last.ckpt"
    assert evaluated_weights("test", None, "adapter", 0, trained) == "adapter"
    assert evaluated_weights("validate", None, None, 0, zero) == "base"
    assert evaluated_weights("validate", None, None, 0, trained) == "in memory"
    assert evaluated_weights("validate", None, None, 4, zero) == "in memory"


@pytest.mark.slow
def test_the_base_model_and_an_adapter_side_by_side_through_the_command(tmp_path, monkeypatch, capsys):
    from lit_grpo.cli import main

    monkeypatch.chdir(tmp_path)  # the quickstart logs to runs/quickstart/version_N
    save_lora_adapter(TINY_LLAMA, tmp_path / "adapter", lambda b: b.fill_(0.01), rank=16)
    common = ["validate", "--config", str(ROOT / "configs/quickstart.yaml"), "--data.val_max_prompts", "8",
              "--data.evaluation.samples", "2", "--data.evaluation.k", "[1, 2]", "--data.evaluation.seed", "5",
              "--trainer.enable_progress_bar", "false"]
    main([*common, "--model.evaluate_base", "true"])
    main([*common, "--model.init_adapter", str(tmp_path / "adapter")])
    runs = tmp_path / "runs" / "quickstart"
    side = {version: [json.loads(line) for line in (runs / version / "evaluations.jsonl").read_text().splitlines()]
            for version in ("version_0", "version_1")}
    assert {line["checkpoint"] for line in side["version_0"]} == {"base"}
    assert {line["checkpoint"] for line in side["version_1"]} == {str(tmp_path / "adapter")}
    for lines in side.values():
        figures = {line["metric"]: (line["n"], line["k"], line["seed"], line["stderr"] is not None) for line in lines}
        assert figures == {"reward": (1, None, None, False), "accuracy": (1, None, None, False),
                           "mean@2": (2, None, 5, True), "pass@1": (2, 1, 5, False), "pass@2": (2, 2, 5, False),
                           "maj@2": (2, None, 5, False), "failed": (2, None, 5, False),
                           "length": (2, None, 5, False)}
    capsys.readouterr()
    for refused, message in (
            (["--model.evaluate_base", "true", "--ckpt_path", "runs/last.ckpt"],
             "model.evaluate_base: true scores the base model, without a checkpoint; ckpt_path 'runs/last.ckpt'"),
            (["--model.init_adapter", str(tmp_path / "missing")],
             f"model.init_adapter: {str(tmp_path / 'missing')!r} is not a PEFT adapter directory"),
            (["--model.init_adapter", str(tmp_path / "adapter"), "--model.model_name_or_path", "data/tiny-qwen2-chat"],
             "does not fit model.model_name_or_path 'data/tiny-qwen2-chat'")):
        with pytest.raises(SystemExit) as stop:
            main([*common, *refused])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and message in err and "Traceback" not in err, err
    assert sorted(path.name for path in runs.iterdir()) == ["version_0", "version_1"]  # refused before a run began
