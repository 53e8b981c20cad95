"""Tasks and rewards (design §8): the seed's sort values, the arithmetic split, JSON-lines files, failing rewards."""

import importlib
import json
import sys
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser

from lit_grpo.tasks import ArithmeticTask, ExactMatchReward, JsonlTask, Reward, SortTask
from lit_grpo.errors import InputError
from lit_grpo.tasks.base import ScoredCompletion
from reliability_doc import documented
from lit_grpo.tasks.single_turn.sort import inclusion_ordering, parse_items, sort_distance

REPO_ROOT = Path(__file__).resolve().parents[1]
PROMPT = [3, 1, 0, 2]  # sorted: [0, 1, 2, 3]


# --- sort rewards ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "response, expected",
    [
        ([0, 1, 2, 3], 4),  # every position equals the sorted prompt
        ([7, 2, 2, 5], 1),  # only position 2 (2 == 2)
        ([0, 3, 1, 2], 1),  # only position 0
    ],
)
def test_sort_distance_seed_values(response, expected):
    assert sort_distance(PROMPT, response) == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ([0, 1, 2, 3], 7),  # inclusion 4 + ordered pairs (0,1) (1,2) (2,3) = 3
        ([7, 2, 2, 5], 3),  # inclusion 1 (only 2) + ordered pairs (2,2) (2,5) = 2; (7,2) is not
        ([0, 3, 1, 2], 6),  # inclusion 4 + ordered pairs (0,3) (1,2) = 2; (3,1) is not
    ],
)
def test_inclusion_ordering_seed_values(response, expected):
    assert inclusion_ordering(PROMPT, response) == expected


def test_sort_distance_unequal_lengths_position_by_position_over_the_shorter():
    # shorter response [0, 2]: position 0 equal (0), position 1 not (2 != 1) -> 1, no IndexError
    assert sort_distance(PROMPT, [0, 2]) == 1
    # longer response: the extra 4 and 5 are beyond the prompt, positions 0-3 all equal -> 4
    assert sort_distance(PROMPT, [0, 1, 2, 3, 4, 5]) == 4
    # longer response that is off by one: [1, 2, 3, 4] against [0, 1, 2, 3] matches nowhere -> 0
    assert sort_distance(PROMPT, [1, 2, 3, 4, 5]) == 0
    assert sort_distance(PROMPT, []) == 0


def test_inclusion_ordering_shorter_response():
    # [0, 1]: inclusion 2 (0 and 1) + ordered pair (0, 1) = 1 -> 3
    assert inclusion_ordering(PROMPT, [0, 1]) == 3
    # [2]: inclusion 1, no pair -> 1
    assert inclusion_ordering(PROMPT, [2]) == 1


def test_inclusion_ordering_longer_response_scored_over_the_shorter():
    # Design §8: a response of another length is scored position by position over the shorter one. The response
    # [0, 1, 2, 3, 4] against a 4-item prompt is scored on positions 0-3: inclusion 4 (all of 3, 1, 0, 2 appear
    # there) + ordered pairs (0,1) (1,2) (2,3) = 3 -> 7, the correct answer's score. Counting the pair (3, 4)
    # beyond the prompt's length gives 8: appending ascending items would then beat the exact answer.
    correct = inclusion_ordering(PROMPT, [0, 1, 2, 3])
    longer = inclusion_ordering(PROMPT, [0, 1, 2, 3, 4])
    assert longer <= correct, f"a longer response outscores the correct answer ({longer} > {correct}): reward hack"
    assert longer == 7


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0,1,x,3", [0, 1, None, 3]),  # a non-integer item matches nothing
        (" 3,1,0,2\n", [3, 1, 0, 2]),  # surrounding whitespace is stripped
        ("1.5,2", [None, 2]),
        ("", [None]),
    ],
)
def test_parse_items(text, expected):
    assert parse_items(text) == expected


def test_non_integer_item_scores_nothing_at_its_position():
    items = parse_items("0,1,x,3")
    # sort_distance: 0 == 0, 1 == 1, None != 2, 3 == 3 -> 3
    assert sort_distance(PROMPT, items) == 3
    # inclusion {0, 1, 3} -> 3; pairs (0,1) ordered, (1,None) and (None,3) skipped -> 1; total 4
    assert inclusion_ordering(PROMPT, items) == 4


def test_sort_task_weighted_rewards_on_text():
    task = SortTask(
        rewards=["sort_distance", "inclusion_ordering"], reward_weights=[1.0, 0.5], num_train=50, heldout_size=10
    )
    record = SortTask.record([3, 1, 0, 2])
    assert record["prompt"] == "sort:3,1,0,2=" and record["answer"] == "0,1,2,3"
    # 1.0 * sort_distance + 0.5 * inclusion_ordering
    assert task.reward(record, "0,1,2,3", []) == 4 + 0.5 * 7  # 7.5
    assert task.reward(record, "7,2,2,5", []) == 1 + 0.5 * 3  # 2.5
    assert task.reward(record, "0,3,1,2", []) == 1 + 0.5 * 6  # 4.0
    assert task.reward(record, "0,1,x,3", []) == 3 + 0.5 * 4  # 5.0
    assert task.reward(record, " 0,1,2,3 ", []) == 7.5  # whitespace stripped


def test_sort_task_reward_selection_and_default_weights():
    record = SortTask.record([3, 1, 0, 2])
    only_inclusion = SortTask(rewards=["inclusion_ordering"], num_train=50, heldout_size=10)
    assert only_inclusion.reward(record, "0,3,1,2", []) == 6.0
    both = SortTask(rewards=["sort_distance", "inclusion_ordering"], num_train=50, heldout_size=10)
    assert both.reward(record, "0,3,1,2", []) == 1.0 + 6.0  # weights 1 each


def test_sort_task_rejects_bad_reward_config():
    with pytest.raises(ValueError, match="unknown sort rewards"):
        SortTask(rewards=["sort_distanse"])
    with pytest.raises(ValueError, match="reward_weights has 1 entries for 2 rewards"):
        SortTask(rewards=["sort_distance", "inclusion_ordering"], reward_weights=[1.0])


def test_sort_task_split_disjoint():
    task = SortTask(num_train=200, heldout_size=50, split_seed=3, test_size=30)
    train = {tuple(r["items"]) for r in task.train_records()}
    validation = {tuple(r["items"]) for r in task.validation_records()}
    test = {tuple(r["items"]) for r in task.test_records()}
    assert (len(train), len(validation), len(test)) == (200, 50, 30)
    assert not train & validation and not train & test and not validation & test
    assert all(3 <= len(items) <= 5 for items in train | validation | test)
    without_test = SortTask(num_train=200, heldout_size=50, split_seed=3, test_size=1)  # test drawn last
    assert without_test.train_records() == task.train_records()
    assert without_test.validation_records() == task.validation_records()


# --- arithmetic --------------------------------------------------------------------------------------------------
def test_arithmetic_split():
    task = ArithmeticTask()
    train, heldout = task.train_records(), task.heldout_records()
    assert len(heldout) >= 1000
    assert len(train) + len(heldout) == 90 * 90  # every (a, b) in [10, 99]^2 exactly once
    train_pairs = {(r["a"], r["b"]) for r in train}
    heldout_pairs = {(r["a"], r["b"]) for r in heldout}
    assert len(train_pairs) == len(train) and len(heldout_pairs) == len(heldout)
    assert not train_pairs & heldout_pairs
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    for r in list(train) + list(heldout):
        assert 10 <= r["a"] <= 99 and 10 <= r["b"] <= 99
        assert r["prompt"] == f"{r['a']}+{r['b']}="
        assert r["answer"] == str(r["a"] + r["b"])


def test_arithmetic_split_deterministic_across_instances():
    first, second = ArithmeticTask(), ArithmeticTask()
    assert list(first.heldout_records()) == list(second.heldout_records())
    assert list(first.train_records()) == list(second.train_records())
    other_seed = ArithmeticTask(split_seed=1)
    assert list(other_seed.heldout_records()) != list(first.heldout_records())


def test_arithmetic_prompt_format():
    assert ArithmeticTask().record(12, 34) == {"prompt": "12+34=", "answer": "46", "a": 12, "b": 34}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("46", 1.0),
        (" 46\n", 1.0),  # whitespace stripped
        ("046", 0.0),  # exact string, not numeric equality
        ("46.0", 0.0),
        ("4 6", 0.0),
        ("47", 0.0),
        ("46=", 0.0),
        ("", 0.0),
    ],
)
def test_arithmetic_reward_exact_match(text, expected):
    task = ArithmeticTask()
    assert task.reward(task.record(12, 34), text, []) == expected


def test_arithmetic_rejects_bad_ranges():
    with pytest.raises(ValueError):
        ArithmeticTask(low=50, high=10)
    with pytest.raises(ValueError):
        ArithmeticTask(low=10, high=11, heldout_size=4)  # only 4 pairs: none left for training


# --- a reward that raises ----------------------------------------------------------------------------------------
def test_raising_reward_scores_failure_reward_with_error():
    task = ArithmeticTask()

    def explode(prompt_record, completion_text, completion_ids):
        raise RuntimeError("disk on fire")

    task.reward_fn = explode
    record = task.record(12, 34)
    scored = task.score(record, "46", [])
    assert scored.reward == task.failure_reward
    assert scored.error == "RuntimeError: disk on fire"
    assert scored.correct  # correctness is the text against the answer, independent of the reward function
    wrong = ArithmeticTask().score(record, "47", [])
    assert wrong.error is None and wrong.reward == 0.0
    assert scored.reward <= wrong.reward  # crashing never pays


@pytest.mark.parametrize("returned, error", [
    (float("nan"), "reward nan is not a finite number within ±1e+06"),
    (float("inf"), "reward inf is not a finite number within ±1e+06"),
    (1e308, "reward 1e+308 is not a finite number within ±1e+06"),
    (-2e6, "reward -2000000.0 is not a finite number within ±1e+06"),
])
def test_a_non_finite_or_huge_reward_is_a_reward_error(returned, error):
    task = ArithmeticTask()
    task.reward_fn = lambda *_: returned
    scored = task.score(task.record(12, 34), "46", [])
    assert (scored.reward, scored.error) == (task.failure_reward, error)
    documented(f"a reward returning {returned!r}", f"a reward error ({scored.error!r}), scored failure_reward "
               f"{scored.reward}", "test_tasks.py")
    task.reward_fn = lambda *_: -1e6  # the limit itself is a reward
    assert task.score(task.record(12, 34), "46", []) == ScoredCompletion(-1e6, True)


def test_a_reward_calling_sys_exit_is_a_reward_error():
    task = ArithmeticTask()

    def leave(*_):
        sys.exit(3)

    task.reward_fn = leave
    scored = task.score(task.record(12, 34), "47", [])
    assert (scored.reward, scored.error) == (task.failure_reward, "SystemExit: 3")
    documented("a reward calling `sys.exit(3)`", f"a reward error ({scored.error!r}), scored failure_reward "
               f"{scored.reward}; the run goes on", "test_tasks.py")


def test_sort_task_raising_reward_never_beats_a_wrong_answer():
    task = SortTask(num_train=50, heldout_size=10)
    crashed = task.score({"prompt": "sort:3,1=", "answer": "1,3"}, "1,3", [])  # no "items": KeyError
    assert crashed.error is not None and crashed.error.startswith("KeyError")
    worst_wrong = task.score(SortTask.record([3, 1]), "9,9", [])  # sort_distance 0: the lowest possible
    assert worst_wrong.reward == 0.0
    assert crashed.reward <= worst_wrong.reward


def test_jsonl_raising_user_reward_never_beats_a_wrong_answer(tmp_path, monkeypatch):
    # Design §8: failure_reward defaults to the task's minimum reward and never exceeds a real wrong answer. A user
    # reward scoring wrong answers -1 (tests.helpers_rewards.SignedReward) must not make a crash worth 0.
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    rewards = importlib.import_module("tests.helpers_rewards")
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "answer": f"a{i}"} for i in range(4)])
    task = JsonlTask(str(path), heldout_fraction=0.25, reward=rewards.SignedReward())
    record = {"prompt": "q0", "answer": "a0"}
    wrong = task.score(record, "a1", [])
    crashed = task.score(record, "boom", [])
    assert wrong.reward == -1.0 and wrong.error is None
    assert crashed.error == "SignedReward: ValueError: reward exploded"
    assert crashed.reward <= wrong.reward, (
        f"a crashing reward scores {crashed.reward} > a wrong answer's {wrong.reward}: crashing pays "
        "(Task.failure_reward is a constant 0.0 and JsonlTask has no way to set it)"
    )


# --- JSON lines --------------------------------------------------------------------------------------------------
def write_jsonl(path: Path, rows: list, extra_lines: tuple[str, ...] = ()) -> Path:
    path.write_text("\n".join([json.dumps(row) for row in rows] + list(extra_lines)) + "\n", encoding="utf-8")
    return path


def test_jsonl_reads_and_splits(tmp_path):
    rows = [{"question": f"q{i}", "solution": f"s{i}", "meta": i} for i in range(10)]
    path = write_jsonl(tmp_path / "p.jsonl", rows, extra_lines=("", "   "))  # blank lines are skipped
    task = JsonlTask(str(path), heldout_fraction=0.3, prompt_key="question", answer_key="solution")
    train, heldout = task.train_records(), task.heldout_records()
    assert len(heldout) == 3 and len(train) == 7  # round(10 * 0.3)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in heldout})
    assert sorted(r["prompt"] for r in list(train) + list(heldout)) == sorted(f"q{i}" for i in range(10))
    for r in list(train) + list(heldout):
        assert r["answer"] == "s" + r["prompt"][1:] and r["meta"] == int(r["prompt"][1:])  # other keys are kept
    again = JsonlTask(str(path), heldout_fraction=0.3, prompt_key="question", answer_key="solution")
    assert list(again.heldout_records()) == list(heldout)  # the split is seeded
    # default reward: exact match against the answer key
    assert task.reward(train[0], f" {train[0]['answer']} ", []) == 1.0
    assert task.reward(train[0], "nope", []) == 0.0


def test_jsonl_heldout_path(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"t{i}", "answer": i} for i in range(5)])
    held = write_jsonl(tmp_path / "held.jsonl", [{"prompt": f"h{i}", "answer": i} for i in range(3)])
    task = JsonlTask(str(path), heldout_path=str(held))
    assert sorted(r["prompt"] for r in task.train_records()) == [f"t{i}" for i in range(5)]  # nothing held out
    assert [r["prompt"] for r in task.heldout_records()] == ["h0", "h1", "h2"]  # file order


def test_jsonl_missing_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(ValueError, match="does not exist") as info:
        JsonlTask(str(missing)).train_records()
    assert str(missing) in str(info.value)


def test_jsonl_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="is empty: it holds no rows") as info:
        JsonlTask(str(path)).train_records()
    assert str(path) in str(info.value)


def test_jsonl_invalid_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a"}], extra_lines=("{not json",))
    with pytest.raises(ValueError, match="not valid JSON") as info:
        JsonlTask(str(path)).train_records()
    assert f"{path}:2:" in str(info.value)


def test_jsonl_missing_prompt_key_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "keys.jsonl", [{"prompt": "a"}, {"prompt": "b"}, {"question": "c"}])
    with pytest.raises(ValueError, match="no 'prompt' column") as info:
        JsonlTask(str(path)).train_records()
    assert str(info.value).startswith(f"{path}:3: no 'prompt' column (it has: question)")
    with pytest.raises(ValueError, match=":1: expected a JSON object, got list"):  # a JSON value that is not an object
        JsonlTask(str(write_jsonl(tmp_path / "list.jsonl", [["prompt", "a"]]))).train_records()


def test_jsonl_rejects_bad_heldout_fraction(tmp_path):
    with pytest.raises(ValueError, match="heldout_fraction"):
        JsonlTask(str(tmp_path / "x.jsonl"), heldout_fraction=1.0)


def test_jsonl_user_reward_by_class_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "answer": f"a{i}"} for i in range(4)])
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(JsonlTask, "task")
    config = parser.parse_object(
        {
            "task": {
                "path": str(path),
                "heldout_fraction": 0.25,
                "reward": {"class_path": "tests.helpers_rewards.SignedReward", "init_args": {"scale": 2.5}},
            }
        }
    )
    task = parser.instantiate(config).task
    assert isinstance(task, JsonlTask)
    assert type(task.reward_fn).__module__ == "tests.helpers_rewards"
    assert type(task.reward_fn).__name__ == "SignedReward"
    record = task.train_records()[0]
    assert task.reward(record, record["answer"], []) == 2.5
    assert task.reward(record, "wrong", []) == -2.5


def test_jsonl_reward_class_path_must_be_a_reward(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "answer": "a"}] * 2)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(JsonlTask, "task")
    with pytest.raises(Exception, match="reward"):
        parser.parse_object({"task": {"path": str(path), "reward": {"class_path": "collections.OrderedDict"}}})


def test_exact_match_reward_strips_both_sides():
    assert ExactMatchReward()({"answer": " 7 "}, "7\n", []) == 1.0
    assert ExactMatchReward()({"answer": 7}, "7", []) == 1.0  # a non-string answer from JSON


def test_jsonl_user_reward_without_min_value_needs_failure_reward(tmp_path):
    class NoFloor(Reward):
        def __call__(self, prompt_record, completion_text, completion_ids):
            return 0.0

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"q{i}", "answer": f"a{i}"} for i in range(4)])
    with pytest.raises(ValueError, match="failure_reward"):
        JsonlTask(str(path), heldout_fraction=0.25, reward=NoFloor())
    task = JsonlTask(str(path), heldout_fraction=0.25, reward=NoFloor(), failure_reward=-5.0)
    assert task.failure_reward == -5.0


def test_jsonl_heldout_file_must_be_disjoint(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "q1", "answer": "a"}, {"prompt": "q2", "answer": "b"}])
    heldout = write_jsonl(tmp_path / "heldout.jsonl", [{"prompt": "q2", "answer": "b"}])
    with pytest.raises(ValueError, match="disjoint"):
        JsonlTask(str(train), heldout_path=str(heldout)).train_records()


def test_jsonl_repeated_prompts_never_straddle_the_split(tmp_path):
    # 4 distinct prompts, each 5 times: held out by distinct prompt, 1 of the 4 (round(4 * 0.3)) with its 5 copies
    rows = [{"prompt": f"q{i % 4}", "answer": str(i % 4)} for i in range(20)]
    task = JsonlTask(str(write_jsonl(tmp_path / "rep.jsonl", rows)), heldout_fraction=0.3)
    train, heldout = task.train_records(), task.heldout_records()
    assert len({r["prompt"] for r in heldout}) == 1 and len(heldout) == 5 and len(train) == 15
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in heldout})


@pytest.mark.parametrize("prompt", [None, "", "   ", 7, ["a"]])
def test_jsonl_a_prompt_that_is_no_text_names_file_and_line(tmp_path, prompt):
    path = write_jsonl(tmp_path / "null.jsonl", [{"prompt": "a"}, {"prompt": prompt}])
    with pytest.raises(InputError) as info:
        JsonlTask(str(path)).train_records()
    assert str(info.value) == f"{path}:2: 'prompt' must be a non-empty string or a list of chat messages, got {prompt!r}"


def test_jsonl_too_few_distinct_prompts_to_hold_one_out(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "a"}, {"prompt": "a"}])
    with pytest.raises(InputError) as info:
        JsonlTask(str(path)).train_records()
    assert str(info.value) == (f"data file {str(path)!r} has 1 distinct prompt(s): too few to hold 1 out and train "
                               "on the rest; add prompts or give heldout_path")



class Unscored(ArithmeticTask):
    """A user's task that forgot its reward: ArithmeticTask's prompts, no reward_fn and no reward() of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.reward_fn = None


def test_a_task_that_cannot_score_says_what_to_define():
    with pytest.raises(InputError, match="Unscored sets no reward_fn and does not override reward.*set "
                                         "self.reward_fn in its __init__"):
        Unscored().reward({"prompt": "1+1=", "answer": "2"}, "2", [])
