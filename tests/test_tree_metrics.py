"""What TensorBoard shows of tree rollouts: the per-epoch tree statistics and the sampled tree with its text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_grpo.callbacks import RolloutMetrics
from lit_grpo.callbacks.metrics import tree_stats
from lit_grpo.run.model_files import load_tokenizer
from lit_grpo.tree import assign_advantages
from lit_grpo.rollout.trees import SegmentNode


def ids(tokenizer, text):
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def sample_tree(tokenizer):
    """"12+?=": answers 30 (right) at once; or asks, hears "b=18;", then answers 30 (right) or 31 (wrong)."""
    def answer(text, reward, correct):
        return SegmentNode(reward=reward, terminal=True, segment=ids(tokenizer, text), kind="answer", correct=correct)

    question = SegmentNode(reward=-0.1, segment=ids(tokenizer, "?"), reply=ids(tokenizer, "b=18;"), kind="ask",
                           children=[answer("30", 1.0, True), answer("31", -1.0, False)])
    root = SegmentNode(record={"prompt": "12+?="}, children=[answer("30", 1.0, True), question])
    assign_advantages(root, "mean")
    return root


def test_tree_stats_count_questions_leaves_and_episodes_behind_each_decision():
    stats = tree_stats([sample_tree(load_tokenizer("data/tiny-llama"))])
    # segments: answer, question, answer, answer; leaf returns 1, 0.9, -1.1; leaves below: 1, 2, 1, 1
    assert stats["ask_rate"] == 0.25 and stats["tree_depth"] == 2
    assert stats["answer_accuracy"] == pytest.approx(2 / 3, abs=1e-12)
    assert stats["mean_return"] == pytest.approx(0.8 / 3, abs=1e-12)
    assert stats["episodes_per_decision"] == 1.25


def test_the_sampled_tree_shows_each_segment_and_reply_with_its_numbers():
    tokenizer = load_tokenizer("data/tiny-llama")
    written = []
    logger = SimpleNamespace(experiment=SimpleNamespace(add_text=lambda tag, text, step: written.append((tag, text))))
    RolloutMetrics().write_tree(SimpleNamespace(logger=logger, global_step=3), sample_tree(tokenizer), tokenizer)
    ((tag, text),) = written
    lines = text.split("```")[1].strip().splitlines()
    assert tag == "tree/sample" and text.startswith("prompt `12+?=`")
    # sigma_tree = pstdev(1, 0.9, -1.1) = 0.967241; V(question) = 0, so the root's children have Q 1 and -0.1
    # (mean 0.45): A = -0.55 / 0.967241 for the question, +-1 / 0.967241 below it
    assert lines[2] == "  continuing r=-0.1000 V=0.0000 Q=-0.1000 A=-0.5686 '?' -> 'b=18;'"
    assert lines[3].endswith("A=1.0339 '30'") and lines[4].endswith("A=-1.0339 '31'")


@pytest.mark.slow
def test_each_validation_writes_a_sampled_tree_with_its_segments_to_tensorboard(tmp_path):
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.tasks.games import HiddenOperandsTask

    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path="data/tiny-llama-hidden", kl={"coef": 0.0},
                          optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))
    datamodule = RolloutDataModule(task=HiddenOperandsTask(), rollout="tree", branching=[2, 2, 2],
                                   prompts_per_epoch=1, minibatch_size=64, max_new_tokens=5, val_max_prompts=1)
    logger = TensorBoardLogger(tmp_path, name="run")
    trainer = pl.Trainer(max_epochs=2, num_sanity_val_steps=0, reload_dataloaders_every_n_epochs=1, logger=logger,
                         callbacks=[RolloutMetrics(table_every_n_epochs=0)], enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule)
    events = EventAccumulator(logger.log_dir, size_guidance={"tensors": 0})
    events.Reload()
    written = events.Tensors("tree/sample/text_summary")
    assert len(written) == 2  # one per validation, none from the (disabled) tables
    text = written[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("prompt `") and " A=" in text and "'" in text.split("```")[1].splitlines()[2]
    assert "rollout/episodes_per_decision" in events.Tags()["scalars"]
