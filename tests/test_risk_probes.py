"""The detached risk head's probe episodes, replay and fit: labels by hand with a scripted greedy engine."""

from __future__ import annotations

import math

import pytest
import torch

from lit_grpo.engines import Completion, SamplingSpec
from lit_grpo.risk.head import RiskHead, RiskHeadSpec
from lit_grpo.risk.fit import RiskReplay, branch_loss, fit_head
from lit_grpo.risk.probes import ProbeLabels, probe_records
from lit_grpo.rollout.probes import probe_labels
from lit_grpo.tasks.games import HiddenOperandsTask
from support import build_char_tokenizer

TOKENIZER = build_char_tokenizer()
EOS = TOKENIZER.eos_token_id
ASK = TOKENIZER("?", add_special_tokens=False)["input_ids"][0]


class GreedyScript:
    """A deterministic engine: per context, the free segment and the segment when an answer is forced; a forced
    question is always ``?`` (the unit under test is the probing, not the model)."""

    shared = True

    def __init__(self, free: dict[str, str], forced_answer: dict[str, str]) -> None:
        self.free, self.forced_answer = free, forced_answer

    def generate(self, prompts, n, sampling):
        assert sampling.greedy and n == 1
        allowed = sampling.allowed_token_ids or (None,) * len(prompts)
        out = []
        for prompt, only in zip(prompts, allowed):
            text = TOKENIZER.decode(prompt, skip_special_tokens=False)
            segment = self.free[text] if only is None else "?" if only == (ASK,) else self.forced_answer[text]
            out.append([Completion(tuple(TOKENIZER(segment, add_special_tokens=False)["input_ids"]) + (EOS,),
                                   (), "stop")])
        return out


def test_probes_label_each_state_with_the_greedy_return_of_inferring_and_of_deferring():
    task = HiddenOperandsTask()
    hidden_b = HiddenOperandsTask.record(37, 25, ["b"])  # "37+?="
    shown = HiddenOperandsTask.record(12, 30, [])  # "12+30="
    engine = GreedyScript(
        free={"<s>37+?=": "?", "<s>37+?=?</s>b=25;": "62", "<s>37+?=?</s>b=25;?</s>none;": "61",
              "<s>12+30=": "42", "<s>12+30=?</s>none;": "42"},
        forced_answer={"<s>37+?=": "40"},
    )
    labels = probe_labels(task, engine, TOKENIZER, [hidden_b, shown], 3, SamplingSpec(max_new_tokens=5,
                                                                                         stop_token_ids=(EOS,)))
    got = {TOKENIZER.decode(list(c), skip_special_tokens=False): (i, d)
           for c, i, d in zip(labels.contexts, labels.infer_returns.tolist(), labels.defer_returns.tolist())}
    nan = math.nan
    expected = {
        # asked (then answered right): defer -0.1 + 1; an answer forced here guesses 40: -1
        "<s>37+?=": (-1.0, 0.9),
        # answered right: infer 1; a question forced here gets "none;" and then 61: -0.1 - 1
        "<s>37+?=?</s>b=25;": (1.0, -1.1),
        "<s>37+?=?</s>b=25;?</s>none;": (-1.0, nan),  # met only after the forced question
        "<s>12+30=": (1.0, 0.9),  # right; forced question then right: -0.1 + 1
        "<s>12+30=?</s>none;": (1.0, nan),
    }
    assert set(got) == set(expected)
    for context, (infer, defer) in expected.items():
        assert got[context][0] == pytest.approx(infer, abs=1e-6, nan_ok=True), context
        assert got[context][1] == pytest.approx(defer, abs=1e-6, nan_ok=True), context


def test_probe_records_are_the_epochs_prompts_then_the_next_ones():
    task = HiddenOperandsTask()
    train = task.train_records()
    epoch = [train[5], train[6]]
    assert probe_records(task, epoch, 7, 4) == [train[5], train[6], train[7], train[8]]
    assert probe_records(task, epoch, len(train) - 1, 4)[2:] == [train[-1], train[0]]  # wraps around
    assert probe_records(task, epoch, 7, 1) == epoch  # never fewer than the epoch's own


def test_replay_keeps_the_latest_rows_and_round_trips_through_tensors():
    replay = RiskReplay(size=2)
    nan = math.nan
    replay.add(ProbeLabels([(1, 2), (3,)], torch.tensor([1.0, nan]), torch.tensor([nan, 0.9])))
    replay.add(ProbeLabels([(1, 2), (4, 5, 6)], torch.tensor([-1.0, 1.0]), torch.tensor([0.5, nan])))
    rows = replay.labels()
    assert rows.contexts == [(1, 2), (4, 5, 6)]  # the two oldest rows are gone; (1, 2) again is a new row
    assert rows.infer_returns.tolist() == [-1.0, 1.0] and rows.defer_returns.tolist()[0] == 0.5
    restored = RiskReplay(size=2)
    restored.load_state_dict(replay.state_dict())
    again = restored.labels()
    assert again.contexts == rows.contexts and torch.equal(again.infer_returns, rows.infer_returns)
    assert torch.equal(again.defer_returns.isnan(), rows.defer_returns.isnan())


def test_branch_loss_counts_each_branch_over_its_own_rows():
    atoms = torch.tensor([-1.0, 0.0, 1.0])
    logits = torch.zeros(2, 2, 3)  # uniform: every cross-entropy is log 3
    nan = math.nan
    # infer observed on row 0 only, defer on both: log 3 + log 3 (each branch a mean over its rows)
    loss = branch_loss(logits, torch.tensor([1.0, nan]), torch.tensor([0.5, -1.0]), atoms)
    assert loss.item() == pytest.approx(2 * math.log(3), abs=1e-6)
    assert branch_loss(logits, torch.tensor([nan, nan]), torch.tensor([nan, nan]), atoms).item() == 0.0


def test_the_fit_learns_a_separable_error_probability():
    head = RiskHead(2, RiskHeadSpec(v_min=-1, v_max=1, num_atoms=3))  # 2 hidden + 2 confidence features
    features = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]] * 8)
    infer = torch.tensor([1.0, -1.0] * 8)  # the first kind of state answers right, the second wrong
    fit_head(head, features, infer, torch.full((16,), math.nan), steps=300, lr=0.1)
    p_error = head.error_probability(features[:2]).tolist()
    assert p_error[0] < 0.05 and p_error[1] > 0.95
