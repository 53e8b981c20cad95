"""The shipped tools and environment are written to TRL 1.16's contract, not lit-grpo's (issue 48): TRL's own
``GRPOTrainer`` constructor accepts them, and the same objects train here through YAML by import path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "tiny-qwen2-tools"


@pytest.mark.slow  # imports TRL, which imports vLLM (about 10 s)
def test_trls_grpo_trainer_accepts_the_same_tools_environment_and_reward(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from lit_grpo.tasks.tools.arithmetic import (
        ArithmeticEnvironment,
        Registers,
        add,
        exact_answer,
        multiply,
        register_answer,
    )

    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 12+30+4?"}], "answer": "46"}] * 4)
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=32, report_to=[], use_cpu=True)
    with_tools = GRPOTrainer(model=str(MODEL), reward_funcs=[exact_answer], args=args, train_dataset=rows,
                             tools=[add, multiply])
    assert [tool.__name__ for tool in with_tools.tools] == ["add", "multiply"]
    with_environment = GRPOTrainer(model=str(MODEL), args=args, train_dataset=rows,
                                   environment_factory=ArithmeticEnvironment)
    assert with_environment.reward_func_names == ["ArithmeticEnvironment"]  # the environment owns the reward
    shipped = GRPOTrainer(model=str(MODEL), reward_funcs=[register_answer], args=args, train_dataset=rows,
                          environment_factory=Registers)  # configs/tools.yaml's: a reward that reads environments=
    assert shipped.reward_func_names == ["register_answer"]


@pytest.mark.slow
@pytest.mark.parametrize("task", [
    [],  # configs/tools.yaml as shipped: an environment and a reward function that reads it
    ["--data.task.init_args.environment", "null", "--data.task.init_args.tools",
     "[lit_grpo.tasks.tools.arithmetic.add, lit_grpo.tasks.tools.arithmetic.multiply]",
     "--data.task.init_args.rewards", "[lit_grpo.tasks.tools.arithmetic.exact_answer]"],  # TRL's tools=
    ["--data.task.init_args.environment", "lit_grpo.tasks.tools.arithmetic.ArithmeticEnvironment",
     "--data.task.init_args.rewards", "[]"],  # the environment owns the reward
], ids=["shipped", "functions", "environment-reward"])
def test_the_same_objects_train_through_yaml(task, tmp_path):
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs/tools.yaml"),
               "--trainer.max_epochs", "1", "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path),
               "--trainer.enable_progress_bar", "false", "--data.prompts_per_epoch", "2", "--data.group_size", "2",
               "--data.val_max_prompts", "4", *task]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(tmp_path.glob("**/adapter/adapter_model.safetensors"))
