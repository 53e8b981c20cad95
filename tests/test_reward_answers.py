"""What reward functions answer (issue 34): lists, numpy arrays and tensors are taken; None and NaN mean "does not
apply"; ±inf or a non-number from one function for one completion costs only that completion (failure_reward, a
reward error) while every other completion and function keeps its value; an answer that is not one value per
completion fails that function's call, named in one warning; rewards get copies of the records; reward_timeout
bounds each call, batched ones too. Each case writes its row of docs/reliability.md (``LIT_GRPO_WRITE_DOCS=1``)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from reliability_doc import documented

from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.scoring import reward_error_warning
from lit_grpo.tasks import ArithmeticTask, DatasetTask, Reward

ROOT = Path(__file__).resolve().parents[1]
THIS = __name__
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}]
FAILURE = -1.0
ODD: dict[str, object] = {}  # what ``odd`` answers for completion 0


def as_array(completions, **kwargs):
    return np.array([0.5, 0.25, 1.0, 0.0])


def as_tensor(completions, **kwargs):
    return torch.tensor([1.0, float("inf"), 2.0, float("nan")])


def as_list(completions, **kwargs):
    return [None, 1, True, np.float32(0.5)]


def odd(completions, **kwargs):
    return ODD["answer"]


def odd_first(completions, **kwargs):
    return [ODD["value"], 1.0, 2.0, 3.0]


SLOW_CALLS: list[Path] = []  # where ``slow`` notes each call (a file: it runs in the reward worker's child)


def slow(completions, **kwargs):
    for path in SLOW_CALLS:
        with path.open("a") as calls:
            calls.write(f"{len(completions)}\n")
    time.sleep(3)
    return [1.0] * len(completions)


def meddler(prompts, completions, completion_ids, solution, **kwargs):
    """Edits everything it is given."""
    for prompt, ids in zip(prompts, completion_ids):
        prompt.append({"role": "user", "content": "MUTATED"})
        prompt[0]["content"] += " MUTATED"
        ids.append(-1)
    solution[0] = "MUTATED"
    return [float(len(p)) for p in prompts]  # 3 messages each when each completion got its own copy


class Meddling(Reward):
    min_value = 0.0

    def __call__(self, prompt_record, completion_text, completion_ids):
        prompt_record["prompt"].clear()
        prompt_record["solution"] = "MUTATED"
        return 1.0


def task(tmp_path: Path, rewards: list, weights: list[float] | None = None) -> DatasetTask:
    import datasets

    rows = [{"prompt": CONVERSATION, "solution": str(n)} for n in range(4)]
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(rows).to_parquet(path)
    return DatasetTask(str(path), answer_column="solution", rewards=rewards, reward_weights=weights,
                       failure_reward=FAILURE)


def scored(scoring: DatasetTask | RewardWorker):
    """The scores of 4 completions ``["0", "1", "2", "x"]`` of the conversation, one record each."""
    records = [{"prompt": copy.deepcopy(CONVERSATION), "solution": str(n), "answer": str(n)} for n in range(4)]
    return scoring.score_group(records, ["0", "1", "2", "x"], [[1], [2], [3], [4]])


def test_arrays_tensors_none_nan_and_one_inf_give_each_completion_its_own_sum(tmp_path):
    result = scored(task(tmp_path, [f"{THIS}.as_array", f"{THIS}.as_tensor", f"{THIS}.as_list"], [1.0, 2.0, 4.0]))
    # as_array 0.5, 0.25, 1, 0; as_tensor 1, inf, 2, NaN; as_list None, 1, True, 0.5 (float32)
    assert [s.reward for s in result] == [0.5 + 2 * 1.0, FAILURE, 1.0 + 2 * 2.0 + 4 * 1.0, 0.0 + 4 * 0.5]
    assert [s.error for s in result] == [None, "as_tensor: inf is not a finite number within ±1e+06", None, None]
    assert result[1].parts == {"as_array": 0.25, "as_tensor": None, "as_list": 1.0}  # the others' values kept
    assert result[3].parts == {"as_array": 0.0, "as_tensor": None, "as_list": 0.5}  # NaN: does not apply
    observed = (f"rewards {[s.reward for s in result]}: the inf completion scored failure_reward {FAILURE}, one "
                "reward error; every other completion its weighted sum, NaN and None left out")
    documented("TRL functions answering a numpy array, a tensor with one inf and one NaN, and a list with None "
               "and a bool", observed, "test_reward_answers.py", section="rows-and-rewards")


GROUP_FAILURES = {
    "a string of the right length": ("1111", "odd: returned str '1111', not a list of 4 rewards"),
    "a dict": ({"a": 1.0}, "odd: returned dict {'a': 1.0}, not a list of 4 rewards"),
    "a list one short": ([1.0, 2.0, 3.0], "odd: returned 3 values for 4 completions"),
    "None": (None, "odd: returned NoneType None, not a list of 4 rewards"),
    "one float": (0.5, "odd: returned float 0.5, not a list of 4 rewards"),
    "a [4, 1] array": (np.ones((4, 1)), "odd: returned a ndarray of shape (4, 1), not one value per completion (4)"),
}


@pytest.mark.parametrize("kind", GROUP_FAILURES)
def test_an_answer_that_is_not_one_value_per_completion_fails_that_call_only(kind, tmp_path):
    ODD["answer"], error = GROUP_FAILURES[kind]
    result = scored(task(tmp_path, [f"{THIS}.as_array", f"{THIS}.odd"]))
    assert [s.reward for s in result] == [FAILURE] * 4 and [s.error for s in result] == [error] * 4
    assert [s.parts["as_array"] for s in result] == [0.5, 0.25, 1.0, 0.0]  # the other function's values kept
    warning = reward_error_warning(result, [{"prompt": CONVERSATION}] * 4)
    assert warning.count("\n") == 1 and f"  {error} (on 4 completion(s)" in warning  # one warning, one line each
    documented(f"a TRL function returning {kind}", f"its call failed: the 4 completions scored failure_reward "
               f"{FAILURE}, 4 reward errors, the other function's values kept in its metrics; one warning: "
               f"{error}", "test_reward_answers.py", section="rows-and-rewards")


PER_COMPLETION = {
    "the string '0.5'": ("0.5", "odd_first: str '0.5' is not a number"),
    "a dict": ({"x": 1}, "odd_first: dict {'x': 1} is not a number"),
    "a list [0.5]": ([0.5], "odd_first: list [0.5] is not a number"),
    "1e7": (1e7, "odd_first: 10000000.0 is not a finite number within ±1e+06"),
    "-inf": (float("-inf"), "odd_first: -inf is not a finite number within ±1e+06"),
    "10**400": (10**400, f"odd_first: int 1{'0' * 59} is not a finite number within ±1e+06"),  # repr cut to 60
    "a complex number": (1 + 0j, "odd_first: complex (1+0j) is not a number"),
    "a 2-element tensor": (torch.ones(2), "odd_first: Tensor of shape (2,) is not one number"),
}


@pytest.mark.parametrize("kind", PER_COMPLETION)
def test_a_value_that_is_no_reward_costs_only_its_completion(kind, tmp_path):
    ODD["value"], error = PER_COMPLETION[kind]
    result = scored(task(tmp_path, [f"{THIS}.odd_first", f"{THIS}.as_array"], [1.0, 10.0]))
    assert [s.reward for s in result] == [FAILURE, 1.0 + 2.5, 2.0 + 10.0, 3.0 + 0.0]
    assert result[0].error.startswith(error) and [s.error for s in result[1:]] == [None] * 3
    assert result[0].parts == {"odd_first": None, "as_array": 0.5}
    documented(f"a TRL function answering {kind} for one completion", f"that completion alone scored failure_reward "
               f"{FAILURE} (a reward error: {result[0].error}); the other 3 and the other function kept their "
               "values", "test_reward_answers.py", section="rows-and-rewards")


def test_a_per_completion_reward_answering_a_string_or_a_bool(tmp_path):
    arithmetic = ArithmeticTask()
    arithmetic.reward_fn = lambda *_: "1.0"
    text = arithmetic.score(arithmetic.record(12, 34), "46", [])
    assert (text.reward, text.error) == (0.0, "reward str '1.0' is not a number")  # float("1.0") would pass it
    arithmetic.reward_fn = lambda *_: True
    assert arithmetic.score(arithmetic.record(12, 34), "46", []).reward == 1.0
    documented("a reward returning the string '1.0'", f"a reward error ({text.error!r}), scored failure_reward "
               f"{text.reward}; `True` / `False` count 1.0 / 0.0 (as TRL counts them)", "test_reward_answers.py",
               section="rows-and-rewards")


def test_rewards_get_copies_and_never_change_the_records(tmp_path):
    records = [{"prompt": copy.deepcopy(CONVERSATION), "solution": str(n), "answer": str(n)} for n in range(2)]
    records = [records[0], records[0], records[1], records[1]]  # a group's completions share their record
    before = copy.deepcopy(records)
    ids = [[1], [2], [3], [4]]
    result = task(tmp_path, [f"{THIS}.meddler", Meddling()]).score_group(records, ["0", "1", "2", "x"], ids)
    assert records == before and ids == [[1], [2], [3], [4]]  # nothing the rewards did reached the records
    assert [s.parts["meddler"] for s in result] == [3.0] * 4  # each completion got its own copy
    assert [s.error for s in result] == [None] * 4
    documented("a reward editing the prompts, columns and ids it is given", "the records, held-out prompts of later "
               "validations included, never changed: rewards get copies, one per completion",
               "test_reward_answers.py", section="rows-and-rewards")


def test_reward_timeout_bounds_one_call_of_a_batched_function(tmp_path, monkeypatch):
    calls = tmp_path / "slow_calls"
    monkeypatch.setattr(f"{THIS}.SLOW_CALLS", [calls])
    worker = RewardWorker(task(tmp_path, [f"{THIS}.slow", f"{THIS}.as_array"]), timeout=1.0)
    try:
        result = scored(worker)
    finally:
        worker.close()
    # one call of the 4 completions, stopped by the timeout (slow takes 3 s), not one bounded call per completion:
    # counted, not timed, so that the machine's load cannot change the verdict
    assert calls.read_text().splitlines() == ["4"]
    error = "slow: TimeoutError: the reward took longer than 1.0s per call"
    assert [s.error for s in result] == [error] * 4 and [s.reward for s in result] == [FAILURE] * 4
    assert [s.parts["as_array"] for s in result] == [0.5, 0.25, 1.0, 0.0]  # scored in its own call, kept
    documented("`reward_timeout: 1` with a batched function taking 3 s", f"that call stopped after 1 s (not 4 x 1 "
               f"s): its 4 completions scored failure_reward {FAILURE}, the other function's values kept",
               "test_reward_answers.py", section="rows-and-rewards")


class HangsOnX(Reward):
    min_value = 0.0

    def __call__(self, prompt_record, completion_text, completion_ids):
        if completion_text == "x":
            time.sleep(60)
        return float(completion_text)


def test_reward_timeout_bounds_each_call_of_a_per_completion_reward(tmp_path):
    worker = RewardWorker(task(tmp_path, [HangsOnX(), f"{THIS}.as_array"]), timeout=1.0)
    try:
        result = scored(worker)
    finally:
        worker.close()
    # HangsOnX 0, 1, 2, hang; as_array 0.5, 0.25, 1, 0
    assert [s.reward for s in result] == [0.5, 1.25, 3.0, FAILURE]
    assert result[3].error == "HangsOnX: TimeoutError: the reward took longer than 1.0s per completion"
    assert result[3].parts == {"HangsOnX": None, "as_array": 0.0}


REWARDS = '''import numpy as np
import torch


def as_array(completions, **kwargs):
    return np.full(len(completions), 0.25)


def spiky(completions, **kwargs):
    return torch.tensor([float("inf")] + [1.0] * (len(completions) - 1))


def sparse(completions, **kwargs):
    return [0.5 if i % 2 == 0 else (None if i % 4 == 1 else float("nan")) for i in range(len(completions))]


def meddler(prompts, completions, **kwargs):
    with open(LOG, "a") as log:
        for prompt in prompts:
            log.write(prompt[-1]["content"] + "\\n")
            prompt[-1]["content"] += " MUTATED"
    return [0.0] * len(completions)
'''


def csv_metrics(root: Path) -> list[dict[str, str]]:
    import csv

    (path,) = root.rglob("metrics.csv")
    with path.open() as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_through_the_command_the_run_goes_on_with_the_right_numbers_and_untouched_prompts(tmp_path):
    (tmp_path / "rewards.py").write_text(f"LOG = {str(tmp_path / 'seen.txt')!r}\n" + REWARDS)
    rows = [{"prompt": [{"role": "user", "content": f"{n}+1="}], "solution": str(n + 1)} for n in range(10, 18)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = ["as_array", "spiky", "sparse", "meddler"]
    config = {
        "seed_everything": 0,
        "trainer": {"max_epochs": 2, "check_val_every_n_epoch": 1, "enable_progress_bar": False,
                    "default_root_dir": str(tmp_path / "runs"),
                    "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                               "init_args": {"save_dir": str(tmp_path / "logs")}}},
        "model": {"model_name_or_path": str(ROOT / "data" / "tiny-qwen2-chat"), "dtype": "float32",
                  "lora": {"rank": 4, "alpha": 8}},
        "data": {"task": {"class_path": "lit_grpo.tasks.DatasetTask", "init_args": {
                     "path": str(tmp_path / "rows.jsonl"), "heldout_fraction": 0.25, "answer_column": "solution",
                     "rewards": [f"{tmp_path}/rewards.py:{name}" for name in names],
                     "reward_weights": [1.0, 2.0, 4.0, 1.0], "failure_reward": -1.0}},
                 "group_size": 2, "prompts_per_epoch": 2, "minibatch_size": 4, "max_new_tokens": 3,
                 "val_max_prompts": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    command = [str(Path(sys.executable).parent / "lit-grpo"), "fit", "--config", str(tmp_path / "run.yaml")]
    result = subprocess.run(command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "spiky: inf is not a finite number within ±1e+06 (on 1 completion(s)" in result.stderr
    epochs = [row for row in csv_metrics(tmp_path / "logs") if row.get("rollout/reward_mean")]
    assert len(epochs) == 2
    for row in epochs:
        # 4 completions: #0 spiky's inf -> -1; #1 0.25 + 2 * 1 (sparse None); #2 0.25 + 2 + 4 * 0.5; #3 as #1 (NaN)
        assert float(row["rollout/reward_mean"]) == (-1.0 + 2.25 + 4.25 + 2.25) / 4
        assert float(row["rollout/reward_errors"]) == 1.0
        means = {name: float(row[f"rollout/rewards/{name}/mean"]) for name in names}
        assert means == {"as_array": 0.25, "spiky": 1.0, "sparse": 0.5, "meddler": 0.0}
    seen = (tmp_path / "seen.txt").read_text().splitlines()
    assert len(seen) >= 8 and not [line for line in seen if "MUTATED" in line]  # every call saw the prompts as given
    documented("`lit-grpo fit` with TRL functions answering a numpy array, a tensor with one inf, a list with None "
               "and NaN, and one editing its prompts", f"exit 0 after 2 epochs; each epoch's reward_mean "
               f"{float(epochs[0]['rollout/reward_mean'])} and reward_errors 1 as computed by hand, each function's "
               "mean its own values'; one warning naming `spiky`; no call saw another's edits",
               "test_reward_answers.py", section="rows-and-rewards")
