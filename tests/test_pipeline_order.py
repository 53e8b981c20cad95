"""Design §2: each epoch generates, scores, runs the no-grad passes, then computes advantages, before training.
The DataModule's train_dataloader draws and scores; the module's on_train_epoch_start runs the no-grad passes and
the advantages, then cuts the minibatches (EpochBatches.serve) that the training steps take."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from support import DigitShareTask

from lit_grpo.buffers.epoch import EpochBatches
from lit_grpo.engines import HFEngine
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.scoring import TimedScoring


class RecordingEngine(HFEngine):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def generate(self, prompts: Any, n: int, sampling: Any) -> Any:
        self.events.append("generate" if not sampling.greedy else "generate-greedy")
        return super().generate(prompts, n, sampling)


class FirstStep(pl.Callback):
    """Records the epoch's first training step, and checks that its minibatch carries the prepared buffer's figures."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            buffer = trainer.datamodule.epoch_report.buffer
            # one minibatch holds the whole buffer (16 rows): its rows are the buffer's, shuffled
            assert sorted(batch["advantages"].tolist()) == sorted(buffer.advantages.tolist())
            rows = batch["old_logp"].sum(dim=1).sort().values
            assert torch.allclose(rows, buffer.old_logp.sum(dim=1).sort().values)
            self.events.append("train")


def test_epoch_order(tiny_llama_dir, tmp_path, monkeypatch):
    events: list[str] = []
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4},
                          kl={"coef": 0.1, "applied_to": "reward"})
    datamodule = RolloutDataModule(
        task=DigitShareTask(), engine=RecordingEngine(events), group_size=4, prompts_per_epoch=4,
        minibatch_size=16, max_new_tokens=4,
    )

    def record(name: str, method: Any, check: Any = None) -> Any:
        def wrapped(*args: Any) -> Any:
            if check is not None:
                check(*args)
            events.append(name)
            return method(*args)
        return wrapped

    def needs_passes_done(buffer: Any) -> None:
        # kl_in="reward" folds beta * KL into the rewards: pi_old and pi_ref must exist before the advantages
        assert buffer.old_logp is not None and buffer.ref_logp is not None and buffer.rewards.abs().sum() > 0

    def loader_returned(method: Any) -> Any:
        def wrapped() -> Any:
            loader = method()
            events.append("loader")  # the DataModule's part of the epoch is over
            return loader
        return wrapped

    serve = EpochBatches.serve
    monkeypatch.setattr(TimedScoring, "__call__", record("score", TimedScoring.__call__))  # the grouped draw's scoring
    monkeypatch.setattr(datamodule, "train_dataloader", loader_returned(datamodule.train_dataloader))
    monkeypatch.setattr(module, "on_train_epoch_start", record("module-epoch-start", module.on_train_epoch_start))
    monkeypatch.setattr(module, "run_no_grad_passes", record("no-grad-passes", module.run_no_grad_passes))
    monkeypatch.setattr(module, "assign_advantages", record("advantages", module.assign_advantages, needs_passes_done))
    monkeypatch.setattr(EpochBatches, "serve", record("serve", serve))
    trainer = pl.Trainer(
        max_epochs=2, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0, limit_val_batches=0,
        callbacks=[FirstStep(events)], default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    one_epoch = ["generate", "score", "loader", "module-epoch-start", "no-grad-passes", "advantages", "serve", "train"]
    assert events == one_epoch * 2


def test_reload_flag_is_required(tiny_llama_dir, tmp_path):
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4})
    datamodule = RolloutDataModule(group_size=2, prompts_per_epoch=2, minibatch_size=4, max_new_tokens=2)
    trainer = pl.Trainer(max_epochs=1, num_sanity_val_steps=0, default_root_dir=tmp_path, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(ValueError, match="reload_dataloaders_every_n_epochs=1"):
        trainer.fit(module, datamodule)


class FakeClock:
    """``time.perf_counter`` that moves only when told: the reward advances it, nothing else does."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reward_time_is_scoring_time_not_generation_time(tiny_llama_dir, tmp_path, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr("lit_grpo.rollout.datamodule.time.perf_counter", clock)  # time.perf_counter everywhere
    task = DigitShareTask()
    original = task.reward

    def slow_reward(*args: Any) -> float:
        clock.now += 10.0  # ten seconds per completion, on the fake clock only
        return original(*args)

    task.reward = slow_reward
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4}, kl={"coef": 0.0})
    datamodule = RolloutDataModule(task=task, group_size=2, prompts_per_epoch=2, minibatch_size=4, max_new_tokens=3)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         limit_val_batches=0, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    # 4 completions scored inside the grouped draw: 40 s of scoring, none of it counted as generating
    assert datamodule.timings == {"push": 0.0, "generate": 0.0, "score": 40.0}
    assert module.preparation_timings == {"no_grad_passes": 0.0}  # the module's part, timed by the module


@pytest.mark.slow
def test_fit_then_test_in_one_process_pushes_the_policy_again(tmp_path):
    # validation at the last step pushed the policy at that step; teardown then closed the engine, and test()
    # skipped the push because the step had not changed: "HFEngine has no policy"
    import lightning.pytorch as pl

    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.tasks import ArithmeticTask

    pl.seed_everything(0)
    module = PolicyModule(kl={"coef": 0.0})
    data = RolloutDataModule(task=ArithmeticTask(), group_size=2, prompts_per_epoch=2, minibatch_size=4,
                             max_new_tokens=3, val_max_prompts=20, val_batch_size=8)  # batches of 8, 8, 4
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_test_batches=3)
    trainer.fit(module, data)
    (results,) = trainer.test(module, data)
    # the figure test() reports is the trained policy's: its greedy answers, computed here apart from the engine
    # and the evaluation loop (a plain forward per token, one prompt at a time), scored by exact match
    records = list(data.task.test_records())[:24]  # the test split's first 3 batches, never validation's prompts
    answers = [greedy_text(module, data.task.prompt_ids(record, module.tokenizer), 3) for record in records]
    right = sum(answer == record["answer"] for answer, record in zip(answers, records))
    assert 0 < right < len(records)  # a figure that tells policies apart: neither all right nor all wrong
    assert results["test/accuracy"] == pytest.approx(right / len(records))
    assert results["test/reward"] == pytest.approx(right / len(records))  # ArithmeticTask: 1 iff exact


def greedy_text(module: Any, prompt_ids: list[int], max_new_tokens: int) -> str:
    """The policy's greedy completion of one prompt by full forwards (no cache, no batching), stripped as scored."""
    ids = list(prompt_ids)
    module.policy.eval()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(module.policy(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token in module.stop_token_ids:
                break
    return module.tokenizer.decode(ids[len(prompt_ids):], skip_special_tokens=True).strip()
