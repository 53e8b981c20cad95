"""Sampled evaluation (issue 59, item 1): the estimators against hand-computed values, one prompt's figures from
scripted samples (a completion task and a tool task), the accumulation over prompts with its standard error, the
greedy figures as they were, a rerun with the same seed on the hf engine (vLLM: test_vllm_engine.py), and bad
settings refused by name."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from lit_grpo.engines import Completion, HFEngine, SamplingSpec
from lit_grpo.errors import InputError
from lit_grpo.policy.evaluation import GreedyEvaluation, mean_and_stderr
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.held_out import HeldOutPrompts
from lit_grpo.rollout.sample_metrics import majority_correct, pass_at_k, prompt_row
from lit_grpo.rollout.sampled import SampledEvaluation, sampled_completion_scores
from lit_grpo.tasks import ArithmeticTask
from support import build_char_tokenizer


# --- the estimators -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 1, Fraction(2, 5)),    # 1 - C(3,1)/C(5,1) = 1 - 3/5
    (5, 2, 2, Fraction(7, 10)),   # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (5, 2, 3, Fraction(9, 10)),   # 1 - C(3,3)/C(5,3) = 1 - 1/10
    (5, 2, 4, Fraction(1)),       # k > n - c = 3: every draw of 4 holds a right one
    (5, 2, 5, Fraction(1)),       # k = n
    (4, 1, 2, Fraction(1, 2)),    # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (10, 3, 4, Fraction(5, 6)),   # 1 - C(7,4)/C(10,4) = 1 - 35/210
    (5, 0, 1, Fraction(0)),       # c = 0
    (5, 0, 5, Fraction(0)),       # c = 0, k = n
    (5, 5, 1, Fraction(1)),       # c = n
    (1, 1, 1, Fraction(1)),
    (1, 0, 1, Fraction(0)),
])
def test_pass_at_k_is_the_unbiased_estimator_exactly(n, c, k, expected):
    assert pass_at_k(n, c, k) == expected
    assert isinstance(pass_at_k(n, c, k), Fraction)


def test_pass_at_k_refuses_what_it_cannot_estimate():
    for n, c, k in [(4, 1, 5), (4, 1, 0), (4, 5, 1), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(n, c, k)


def test_the_majority_answer_decides_and_a_tie_goes_to_the_first_given():
    assert majority_correct(["7", "8", "7", None], [True, False, True, False]) is True
    assert majority_correct(["8", "8", "7"], [False, False, True]) is False  # the right answer is a minority
    assert majority_correct(["8", "7"], [False, True]) is False  # tie: "8" came first
    assert majority_correct(["7", "8"], [True, False]) is True
    assert majority_correct([None, None, "7"], [False, False, True]) is True  # no answer does not vote
    assert majority_correct([None, None], [False, False]) is False


def test_one_prompts_row_by_hand():
    row = prompt_row([1.0, 0.0, 0.5, 1.0], [True, False, False, True], [False, False, True, False], [3, 5, 4, 6],
                     [1, 2, 3], answers=["7", "8", None, "7"])
    assert row == {"mean@4": 2.5 / 4, "pass@1": 0.5, "pass@2": 5 / 6, "pass@3": 1.0, "maj@4": 1.0, "failed": 0.25,
                   "length": 4.5}
    episodes = prompt_row([1.0, 0.0], [True, False], [False, False], [10, 4], [1], calls=[2, 0], turns=[3, 1])
    assert episodes == {"mean@2": 0.5, "pass@1": 0.5, "failed": 0.0, "length": 7.0, "calls_per_episode": 1.0,
                        "turns_per_episode": 2.0}


def test_mean_and_stderr_across_prompts_by_hand():
    # mean 0.5; sample variance (0.25 + 0.25 + 0 + 0) / 3 = 1/6; stderr sqrt(1/6) / sqrt(4)
    assert mean_and_stderr(torch.tensor([1.0, 0.0, 0.5, 0.5])) == (0.5, 0.2041241452319315)
    assert mean_and_stderr(torch.tensor([0.25, 0.75])) == (0.5, 0.25)  # var 0.125, sqrt(0.125 / 2)
    mean, stderr = mean_and_stderr(torch.tensor([0.75]))
    assert mean == 0.75 and math.isnan(stderr)


# --- one batch of a completion task, from scripted samples ----------------------------------------------------------
TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id


class Scripted:
    """An engine answering prompt i with ``texts[i]`` (n of them), recording each call's sampling."""

    shared = True

    def __init__(self, texts):
        self.texts, self.specs = texts, []

    def generate(self, prompts, n, sampling):
        self.specs.append((len(prompts), n, sampling))
        return [[Completion(tuple(TOKENIZER(t, add_special_tokens=False)["input_ids"]) + (EOS,), None, "stop")
                 for t in self.texts[i][:n]] for i in range(len(prompts))]


def test_a_batch_of_samples_gives_each_prompts_figures_by_hand():
    task = ArithmeticTask()
    records = [{"prompt": "12+13=", "answer": "25"}, {"prompt": "40+2=", "answer": "42"}]
    engine = Scripted([["25", "24", "25", "3"], ["41", "42", "40", "43"]])
    spec = SampledEvaluation(samples=4, k=[1, 2, 4], temperature=0.7, seed=5)
    sampling = SamplingSpec(4, greedy=False, temperature=0.7, seed=11, stop_token_ids=(EOS,))
    figures = sampled_completion_scores(task, engine, task, TOKENIZER, records, sampling, spec)
    assert engine.specs == [(2, 4, sampling)]
    assert {name: values.tolist() for name, values in figures.items()} == {
        "mean@4": [0.5, 0.25],
        "pass@1": [0.5, 0.25],
        "pass@2": [5 / 6, 0.5],  # 1 - C(2,2)/C(4,2); 1 - C(3,2)/C(4,2)
        "pass@4": [1.0, 1.0],
        "maj@4": [1.0, 0.0],  # "25" twice; four answers once each: the first, "41", is wrong
        "failed": [0.0, 0.0],
        "length": [(3 + 3 + 3 + 2) / 4, 3.0],  # each text's characters and the end token
    }


def test_the_module_averages_the_figures_over_prompts_and_keeps_the_greedy_ones_as_they_were():
    greedy = GreedyEvaluation()
    greedy.update({"reward": torch.tensor([1.0, 0.0, 1.0]), "correct": torch.tensor([True, False, True])})
    greedy.update({"reward": torch.tensor([0.0]), "correct": torch.tensor([False])})
    assert greedy.compute() == {"reward": 0.5, "accuracy": 0.5}  # nothing more without samples
    sampled = GreedyEvaluation()
    sampled.update({"reward": torch.tensor([1.0, 0.0]), "correct": torch.tensor([True, False]),
                    "mean@4": torch.tensor([1.0, 0.0], dtype=torch.float64),
                    "pass@2": torch.tensor([1.0, 1 / 3], dtype=torch.float64)})
    sampled.update({"reward": torch.tensor([1.0, 1.0]), "correct": torch.tensor([True, True]),
                    "mean@4": torch.tensor([0.5, 0.5], dtype=torch.float64),
                    "pass@2": torch.tensor([0.0, 1 / 3], dtype=torch.float64)})
    assert sampled.compute() == {"reward": 0.75, "accuracy": 0.75, "mean@4": 0.5, "mean@4_stderr": 0.2041241452319315,
                                 "pass@2": (1 + 2 / 3) / 4}
    sampled.update({"reward": torch.tensor([0.0]), "correct": torch.tensor([False]),
                    "mean@4": torch.tensor([0.25], dtype=torch.float64), "pass@2": torch.tensor([0.5])})
    after = sampled.compute()  # the next validation starts afresh
    assert after["mean@4"] == 0.25 and after["pass@2"] == 0.5 and math.isnan(after["mean@4_stderr"])


# --- a tool task: calls and turns per episode ------------------------------------------------------------------------
@pytest.mark.slow  # the chat tokenizer and template load
def test_a_tool_tasks_episodes_give_pass_at_k_calls_and_turns():
    from test_tool_turns import CALL, RECORDS, TOKENIZER as QWEN, ScriptedEngine, add, exact_answer

    from lit_grpo.rollout.sampled import sampled_episode_scores
    from lit_grpo.tasks.tools.task import ToolTask

    task = ToolTask(records=RECORDS, tools=[add], rewards=[exact_answer], max_turns=2)
    engine = ScriptedEngine(lambda turn, text: [CALL, "7", "8", CALL] if turn == 1 else ["7"])
    record = {"prompt": [{"role": "user", "content": "What is 3+4?"}], "answer": "7"}
    end = QWEN.convert_tokens_to_ids("<|im_end|>")
    figures = sampled_episode_scores(task, engine, QWEN, [record], 2,
                                     SamplingSpec(64, greedy=False, seed=3, stop_token_ids=(end,)),
                                     SampledEvaluation(samples=4, k=[1, 2]))
    tokens = {text: len(QWEN(text, add_special_tokens=False)["input_ids"]) + 1 for text in (CALL, "7", "8")}
    # episodes: add then "7" (right, 2 turns, 1 call); "7" (right); "8" (wrong); add then "7" (right)
    assert {name: values.tolist() for name, values in figures.items()} == {
        "mean@4": [0.75], "pass@1": [0.75], "pass@2": [1.0], "failed": [0.0],
        "length": [(2 * (tokens[CALL] + tokens["7"]) + tokens["7"] + tokens["8"]) / 4],
        "calls_per_episode": [0.5], "turns_per_episode": [1.5]}


# --- a rerun with the same seed, on the hf engine ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_rerun_with_the_same_seed_gives_the_same_figures_on_the_hf_engine(tiny_llama_dir):
    from lit_grpo.policy.model_loading import load_policy
    from lit_grpo.run.model_files import load_tokenizer

    policy = load_policy(str(tiny_llama_dir), 4, 8, 0.0, "all-linear").eval()
    tokenizer = load_tokenizer(str(tiny_llama_dir))
    engine = HFEngine()
    engine.push_policy(policy)
    task = ArithmeticTask()
    greedy = SamplingSpec(4, greedy=True, stop_token_ids=(tokenizer.eos_token_id,))

    def figures(seed, evaluation=True):
        spec = SampledEvaluation(samples=4, k=[1, 2, 4], temperature=1.0, seed=seed) if evaluation else None
        held = HeldOutPrompts(task, engine, task, None, 6, 3, spec)
        return [held.scores(tokenizer, batch, greedy, None) for batch in (held.validation()[:3], held.validation()[3:])]

    first, again, other = figures(1), figures(1), figures(2)
    assert [sorted(batch) for batch in first] == [["correct", "failed", "length", "maj@4", "mean@4", "pass@1",
                                                   "pass@2", "pass@4", "reward"]] * 2
    assert all(torch.equal(a[name], b[name]) for a, b in zip(first, again) for name in a)
    assert any(not torch.equal(a["length"], b["length"]) for a, b in zip(first, other))  # the seed is used
    # the greedy figures beside them are those of a greedy evaluation, which returns them alone
    plain = figures(1, evaluation=False)
    assert all(torch.equal(p[0], s["reward"]) and torch.equal(p[1], s["correct"]) for p, s in zip(plain, first))


# --- bad settings --------------------------------------------------------------------------------------------------
def test_bad_sampled_settings_are_refused_each_by_name():
    with pytest.raises(InputError) as refused:
        RolloutDataModule(evaluation=SampledEvaluation(samples=0, temperature=0.0, k=[]))
    assert str(refused.value).splitlines()[1:] == [
        "  - evaluation.samples: must be >= 1 (samples per prompt), got 0",
        "  - evaluation.temperature: must be > 0 (greedy alone: leave evaluation unset), got 0.0",
        "  - evaluation.k: give at least one k for pass@k, e.g. [1]"]
    with pytest.raises(InputError, match=r"evaluation.k: each k of pass@k must be within 1..samples \(4\), got "
                                         r"\[1, 8\]: lower k or raise evaluation.samples"):
        RolloutDataModule(evaluation={"samples": 4, "k": [1, 8]})
    assert RolloutDataModule(evaluation={"samples": 4, "k": [4]}).held_out.evaluation == SampledEvaluation(4, k=[4])


def test_a_sampled_subset_of_the_prompts_leaves_the_greedy_figures_covering_them_all():
    task = ArithmeticTask()
    engine = Scripted([["25", "24"]] * 5)  # answers every prompt so: wrong but for none
    held = HeldOutPrompts(task, engine, task, None, 5, 2, SampledEvaluation(samples=2, k=[1], prompts=3))
    greedy = SamplingSpec(4, greedy=True, stop_token_ids=(EOS,))
    batches = list(held.loader(held.validation(), lambda records: held.scores(TOKENIZER, records, greedy, None)))
    assert [len(b["reward"]) for b in batches] == [2, 2, 1]
    assert [len(b.get("pass@1", [])) for b in batches] == [2, 1, 0]  # the first 3 prompts sampled
    assert [(n, k, s.greedy) for n, k, s in engine.specs] == [(2, 1, True), (2, 2, False), (2, 1, True), (1, 2, False),
                                                             (1, 1, True)]


def test_an_evaluation_of_no_prompt_is_refused_before_the_weights_load():
    from lit_grpo.rollout.settings import held_out_problems
    from lit_grpo.tasks import Task

    class NoHeldOut(Task):
        def split(self):
            return [{"prompt": "1+1=", "answer": "2"}], [], []

    assert held_out_problems(NoHeldOut(), "validate", True) == [
        "data.task: NoHeldOut's validation split is empty: a validation would score no prompt; give the task "
        "held-out prompts, or turn validation off (trainer.limit_val_batches: 0)"]
    assert held_out_problems(NoHeldOut(), "fit", False) == []  # no validation runs
    assert held_out_problems(NoHeldOut(), "test", False) == [
        "data.task: NoHeldOut's test split is empty (too few held-out prompts to divide between validation and "
        "test): give more prompts, or a test split of their own"]
    assert held_out_problems(ArithmeticTask(), "validate", True) == []
