"""RewardModel (issue 19): a local sequence-classification checkpoint scores prompt + completion exactly as a direct
forward of the classifier does, batched with padding, inside DatasetTask and through a reward worker process."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

from lit_grpo.errors import InputError
from lit_grpo.tasks import DatasetTask, RewardModel
from lit_grpo.tasks.rewards.functions import Completions

ROOT = Path(__file__).resolve().parents[1]
CHAT_MODEL = ROOT / "data" / "tiny-qwen2-chat"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SYSTEM_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 classifier (one output) with the release-shaped test model's tokenizer and template."""
    target = tmp_path_factory.mktemp("tiny-reward-model")
    for name in TOKENIZER_FILES:
        shutil.copy(CHAT_MODEL / name, target / name)
    tokenizer = AutoTokenizer.from_pretrained(target)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32_704, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    Qwen2ForSequenceClassification(config).save_pretrained(target)
    return target


def direct_scores(directory: Path, texts: list[str]) -> list[float]:
    """The classifier's output for each text alone (a forward of its own, no padding), fp32."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = Qwen2ForSequenceClassification.from_pretrained(directory, dtype=torch.float32).eval()
    alone = [torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]]) for text in texts]
    with torch.no_grad():
        return [float(model(input_ids=ids).logits[0, 0]) for ids in alone]


def batch() -> Completions:
    """Three completions of different lengths (padding in a batch of two) and one plain-string prompt."""
    records = [{"prompt": SYSTEM_USER}, {"prompt": SYSTEM_USER}, {"prompt": SYSTEM_USER}, {"prompt": "3+3="}]
    return Completions(records, ["4", "The answer is four, surely.", "5", "6"], [[1], [2], [3], [4]], True)


@pytest.mark.slow
def test_scores_equal_a_direct_forward_on_the_same_texts(reward_model_dir: Path) -> None:
    scorer = RewardModel(str(reward_model_dir), dtype="float32", batch_size=2)
    texts = [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n"
        "The answer is four, surely.<|im_end|>\n",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2=<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n",
        "<|im_start|>user\n3+3=<|im_end|>\n<|im_start|>assistant\n6<|im_end|>\n",
    ]
    assert scorer.texts(batch()) == texts
    expected = direct_scores(reward_model_dir, texts)
    scores = scorer.score_batch(batch())
    assert len(set(expected)) == 4  # the texts differ in what the classifier sees
    assert max(abs(s - e) for s, e in zip(scores, expected)) <= 1e-5


def test_inside_a_dataset_task_and_a_reward_worker(reward_model_dir: Path, tmp_path: Path) -> None:
    import datasets

    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list([{"prompt": SYSTEM_USER, "answer": str(i)} for i in range(4)]).to_parquet(path)
    scorer = RewardModel(str(reward_model_dir), dtype="float32", name="judge")
    task = DatasetTask(str(path), rewards=[scorer], reward_weights=[2.0], failure_reward=-10.0)
    one = batch()
    scored = task.score_group(one.records[:3], one.texts[:3], one.ids[:3])
    expected = scorer.score_batch(Completions(one.records[:3], one.texts[:3], one.ids[:3], True))
    assert [s.parts for s in scored] == [{"judge": value} for value in expected]
    assert [s.reward for s in scored] == [2.0 * value for value in expected]
    copy = pickle.loads(pickle.dumps(scorer))  # what a reward worker process receives: the path, not the weights
    assert len(pickle.dumps(scorer)) < 10_000  # the weights alone take megabytes
    assert copy.score_batch(one) == scorer.score_batch(one)


@pytest.mark.slow
def test_a_causal_lm_or_a_missing_directory_is_refused_before_work(reward_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"not a sequence-classification checkpoint \(its config.json names "
                                         r"\['Qwen2ForCausalLM'\]\); its score head would be random"):
        RewardModel(str(CHAT_MODEL))
    headless = tmp_path / "headless"  # says it is a classifier, but its weights hold no head
    shutil.copytree(CHAT_MODEL, headless)
    (headless / "config.json").write_text((headless / "config.json").read_text().replace(
        "Qwen2ForCausalLM", "Qwen2ForSequenceClassification"))
    with pytest.raises(InputError, match="not a sequence-classification checkpoint: 1 weight.s. missing, e.g. 'score"):
        RewardModel(str(headless))
    with pytest.raises(InputError, match="RewardModel path .*nowhere"):
        RewardModel(str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match=r"label_index 1 is outside its 1 output\(s\) \(0 LABEL_0\); give 0 to 0"):
        RewardModel(str(reward_model_dir), label_index=1)


def two_label_copy(reward_model_dir: Path, target: Path, **settings: object) -> Path:
    """The tiny classifier with a two-output head (id2label and the like from ``settings``), saved at ``target``."""
    shutil.copytree(reward_model_dir, target)
    model = Qwen2ForSequenceClassification.from_pretrained(reward_model_dir)
    model.config.update(settings)
    torch.manual_seed(1)
    model.score = torch.nn.Linear(model.config.hidden_size, 2, bias=False)
    model.config.num_labels = 2
    model.config.update(settings)
    model.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def sentiment(reward_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny classifier with a NEGATIVE/POSITIVE head, built once for the tests that only read it."""
    return two_label_copy(reward_model_dir, tmp_path_factory.mktemp("two-labels") / "sentiment",
                          id2label={0: "NEGATIVE", 1: "POSITIVE"}, label2id={"NEGATIVE": 0, "POSITIVE": 1})


@pytest.mark.slow
def test_a_head_with_several_outputs_is_refused_until_one_is_named(reward_model_dir, sentiment, tmp_path):
    with pytest.raises(InputError) as info:
        RewardModel(str(sentiment))
    assert str(info.value) == (
        f"RewardModel {str(sentiment)!r}: its classifier head has 2 outputs (0 NEGATIVE, 1 POSITIVE) and the score is "
        "one of them: name it with label (e.g. label: POSITIVE) or label_index in the RewardModel's init_args")
    with pytest.raises(InputError, match=r"label 'positive' is not one of its outputs \(0 NEGATIVE, 1 POSITIVE\)"):
        RewardModel(str(sentiment), label="positive")
    with pytest.raises(InputError, match=r"label_index 2 is outside its 2 output\(s\) \(0 NEGATIVE, 1 POSITIVE\); "
                                         r"give 0 to 1, or name one with label"):
        RewardModel(str(sentiment), label_index=2)
    with pytest.raises(InputError, match="label 'POSITIVE' and label_index 1 both pick the score; give one"):
        RewardModel(str(sentiment), label="POSITIVE", label_index=1)
    assert RewardModel(str(sentiment), label="POSITIVE").label_index == 1
    assert RewardModel(str(sentiment), label_index=0).label_index == 0
    regression = two_label_copy(reward_model_dir, tmp_path / "regression", problem_type="regression")
    with pytest.raises(InputError, match=r"its regression head has 2 outputs \(0 LABEL_0, 1 LABEL_1\)"):
        RewardModel(str(regression))


def test_the_positive_label_is_what_is_scored(sentiment):
    scorer = RewardModel(str(sentiment), dtype="float32", label="POSITIVE")
    tokenizer = AutoTokenizer.from_pretrained(sentiment)
    model = Qwen2ForSequenceClassification.from_pretrained(sentiment, dtype=torch.float32).eval()
    text = scorer.texts(Completions([{"prompt": "3+3="}], ["6"], [[1]], False))[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])).logits[0]
    assert scorer.score_batch(Completions([{"prompt": "3+3="}], ["6"], [[1]], False)) == [float(logits[1])]


@pytest.mark.slow
def test_a_reward_model_beside_a_trl_function_trains_through_the_command_in_a_reward_worker(reward_model_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_grpo.cli import main

    rewards = ('[examples/trl_rewards.py:accuracy, {class_path: lit_grpo.tasks.RewardModel, init_args: '
               f'{{path: {reward_model_dir}, dtype: float32, name: judge}}}}]')
    main(["fit", "--config", str(ROOT / "configs" / "trl_style.yaml"), "--data.task.rewards", rewards,
          "--data.task.reward_weights", "[1.0, 0.1]", "--data.reward_timeout", "120", "--trainer.max_epochs", "1",
          "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.save_dir", str(tmp_path),
          "--trainer.enable_progress_bar", "false"])
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    judge = accumulator.Scalars("rollout/rewards/judge/mean")
    assert len(judge) == 1 and judge[0].value != 0.0  # scored by the classifier in the worker process
    assert accumulator.Scalars("rollout/reward_errors")[0].value == 0.0
