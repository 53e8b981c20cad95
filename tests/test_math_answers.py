"""MathVerify (issue 59, item 4): math answers checked by math-verify, as GRPO recipes check GSM8K and MATH: several
forms of one answer score 1, others 0; hostile answers in the reward worker end as counted failures of their own
completion; the shipped config trains through the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lit_grpo.errors import InputError
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.tasks import DatasetTask
from lit_grpo.tasks.rewards import math_answers
from lit_grpo.tasks.rewards.math_answers import MathVerify

pytest.importorskip("math_verify")  # the test extra installs it (pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "data" / "math-answers" / "rows.jsonl"
HUGE = "\\boxed{" + "1+" * 200_000 + "1}"  # 400k characters of LaTeX: minutes of math-verify on one core
NESTED = "\\boxed{" + "{" * 5_000 + "1" + "}" * 5_000 + "}"  # as long again, nested 5000 deep
TOWER = "\\boxed{9^{9^{9^{9^{9}}}}}"  # parses at once; sympy's comparison with the gold never ends

# gold (as the shipped file gives it) -> completions equal to it, and completions that are not (written by hand)
EQUAL = {
    "\\frac{1}{2}": ["The answer is \\boxed{0.5}", "1/2", "$\\frac{2}{4}$", "\\boxed{\\dfrac{1}{2}}",
                     "\\boxed{50\\%}",  # math-verify reads a percentage as the number over 100
                     "first 2, no: \\boxed{\\frac12}"],  # the boxed answer wins over an earlier one
    "x = 3": ["\\boxed{3}", "x=3", "3.0"],
    "2\\sqrt{2}": ["\\boxed{\\sqrt{8}}", "$2\\sqrt2$", "\\boxed{2 \\cdot \\sqrt{2}}", "2.828427"],
    "25\\%": ["\\boxed{25\\%}", "0.25", "\\boxed{\\frac14}"],
    "90^\\circ": ["90", "\\boxed{90^{\\circ}}"],
    "2x+1": ["\\boxed{1+2x}", "$2 x + 1$"],
    "0.3": ["\\boxed{\\frac{3}{10}}", "0.30000000000000004"],  # rounded to 6 decimals, as math-verify does
    "-7": ["\\boxed{-7}"],
}
UNEQUAL = {
    "\\frac{1}{2}": ["1/3", "\\boxed{2}/4", "I do not know", "", "\\boxed{-\\frac{1}{2}}"],
    "2\\sqrt{2}": ["\\boxed{\\sqrt{2}}", "2.83"],
    "90^\\circ": ["\\boxed{\\frac{\\pi}{2}}"],  # degrees are not converted
    "\\pi": ["3.14159", "180"],
    "2x+1": ["\\boxed{2y+1}", "x^2"],
    "0.3": ["0.31"],
    "-7": ["7"],
}


def score(reward: MathVerify, gold: str, completion: str) -> float:
    return reward({"prompt": "?", "answer": gold}, completion, [])


def test_equivalent_forms_of_an_answer_score_one_and_others_zero():
    golds = {json.loads(line)["answer"] for line in ROWS.read_text().splitlines()}
    assert set(EQUAL) | set(UNEQUAL) <= golds  # the shipped file's golds, in its forms
    reward = MathVerify()
    wrong = [(g, c) for g, forms in EQUAL.items() for c in forms if score(reward, g, c) != 1.0]
    wrong += [(g, c) for g, forms in UNEQUAL.items() for c in forms if score(reward, g, c) != 0.0]
    assert wrong == []


def test_the_gold_answer_is_parsed_once_and_one_that_does_not_parse_is_a_reward_error(monkeypatch, tmp_path):
    calls = []
    parse_gold = math_answers.parsed_gold
    monkeypatch.setattr(math_answers, "parsed_gold", lambda text: calls.append(text) or parse_gold(text))
    reward = MathVerify()
    assert [score(reward, "\\frac{1}{2}", c) for c in ("0.5", "1/2", "0.25")] == [1.0, 1.0, 0.0]
    assert calls == ["\\frac{1}{2}"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": a}) + "\n"
                            for i, a in enumerate(["7", "", "7", "7"])))
    task = DatasetTask(str(rows), rewards=[reward], heldout_fraction=0.5)
    scored = task.score_group([{"prompt": "q0", "answer": "7"}, {"prompt": "q1", "answer": ""}], ["\\boxed{7}"] * 2,
                              [[1], [1]])
    assert [(s.reward, s.error) for s in scored] == [
        (1.0, None), (0.0, "MathVerify: ValueError: the gold answer '' does not parse as math (math-verify extracts "
                           "nothing)")]


def test_without_the_extra_the_command_refuses_the_config_naming_the_install(monkeypatch, tmp_path, capsys):
    from lit_grpo.cli import main

    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify raises ImportError
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", str(ROOT / "configs" / "math_verify.yaml"), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "pip install 'lit-grpo[math]' (math-verify==0.9.0)" in err


@pytest.mark.slow
def test_hostile_answers_in_the_reward_worker_fail_alone_and_the_batch_still_scores(monkeypatch, tmp_path):
    import math_verify

    parse = math_verify.parse

    def hangs_on_marker(text, *args, **kwargs):
        if "HANG" in text:
            time.sleep(3600)
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(math_verify, "parse", hangs_on_marker)  # the forked worker inherits it
    task = DatasetTask(str(ROWS), rewards=[MathVerify()], heldout_fraction=0.25)
    record = {"prompt": "What is 1 divided by 2?", "answer": "\\frac{1}{2}"}
    texts = ["\\boxed{1/2}", HUGE, "0.5", NESTED, "\\boxed{HANG}", "1/3", TOWER]
    assert task.score(record, "1/2", [1]).reward == 1.0  # in this process: each worker forks with the gold parsed
    worker = RewardWorker(task, timeout=1.0)
    try:
        scored = worker.score_group([record] * len(texts), texts, [[1]] * len(texts))
    finally:
        worker.close()
    timed_out = "MathVerify: TimeoutError: the reward took longer than 1.0s per completion"
    assert [(s.reward, s.error) for s in scored] == [(1.0, None), (0.0, timed_out), (1.0, None), (0.0, timed_out),
                                                     (0.0, timed_out), (0.0, None), (0.0, timed_out)]


@pytest.mark.slow
def test_the_math_config_trains_through_the_command_and_counts_a_hostile_gold(tmp_path):
    # the shipped rows plus one whose gold answer is hostile: each completion of that prompt costs math-verify
    # minutes, cut at the reward timeout and counted; the others score. Split seed 1 keeps it among the 13 training
    # prompts (seed 0 holds it out), all of which the epoch draws
    rows = tmp_path / "rows.jsonl"
    hostile = json.dumps({"prompt": "Hostile? Put the final answer in \\boxed{}.", "answer": NESTED})
    rows.write_text(ROWS.read_text() + hostile + "\n")
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", "configs/math_verify.yaml",
               "--data.task.init_args.path", str(rows), "--data.task.init_args.split_seed", "1",
               "--data.prompts_per_epoch", "13", "--data.reward_timeout",
               "1", "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path),
               "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (events,) = tmp_path.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert [s.value for s in accumulator.Scalars("rollout/reward_errors")] == [4.0]  # the hostile prompt's group
    assert "rollout/rewards/MathVerify/mean" in accumulator.Tags()["scalars"]
    assert "MathVerify: TimeoutError: the reward took longer than 1.0s per completion" in result.stderr
