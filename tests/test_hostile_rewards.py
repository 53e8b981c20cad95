"""A reward that raises ``KeyboardInterrupt`` or ``SystemExit`` is the reward's exception, named, in the trainer's
process and in the reward worker; the user's real Ctrl-C during a reward call still stops the run (issue 42 §3)."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest
from reliability_doc import documented

from lit_grpo.cli import main
from lit_grpo.run.signals import Terminated
from lit_grpo.tasks.rewards.functions import Completions, reward_column
from lit_grpo.tasks.rewards.guard import reward_outcome

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--data.prompts_per_epoch", "2", "--data.group_size", "2", "--data.minibatch_size", "4",
         "--data.max_new_tokens", "3", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
         "--trainer.enable_checkpointing", "false"]


def own_interrupt() -> float:
    raise KeyboardInterrupt("the reward's own")


def users_ctrl_c() -> float:
    os.kill(os.getpid(), signal.SIGINT)  # what the terminal sends on Ctrl-C, arriving while the reward runs
    raise AssertionError("the signal's KeyboardInterrupt is raised before this line")


def users_ctrl_c_swallowed() -> float:
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt:
        return 1.0  # a reward that catches everything
    return 0.0


def users_ctrl_c_rewrapped() -> float:
    try:
        os.kill(os.getpid(), signal.SIGINT)
    except KeyboardInterrupt as error:
        raise ValueError("wrapped") from error
    return 0.0


def test_a_rewards_own_interrupt_or_exit_is_its_failure():
    answer, error = reward_outcome(own_interrupt)
    assert answer is None and type(error) is KeyboardInterrupt and str(error) == "the reward's own"
    answer, error = reward_outcome(lambda: exit(3))
    assert answer is None and type(error) is SystemExit and error.code == 3
    assert reward_outcome(lambda: 0.5) == (0.5, None)
    batch = Completions([{"prompt": "1+1="}], ["2"], [[5]], False)

    def interrupting(**arguments: object) -> list[float]:
        raise KeyboardInterrupt("the reward's own")

    assert reward_column(interrupting, "interrupting", batch) == (
        [None], ["interrupting: KeyboardInterrupt: the reward's own"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back


def test_the_users_ctrl_c_during_a_reward_still_stops_the_run():
    with pytest.raises(KeyboardInterrupt) as info:
        reward_outcome(users_ctrl_c)
    assert str(info.value) == ""  # Python's own, from the signal
    with pytest.raises(KeyboardInterrupt, match="Ctrl-C while a reward ran"):
        reward_outcome(users_ctrl_c_swallowed)
    with pytest.raises(KeyboardInterrupt, match="Ctrl-C while a reward ran"):
        reward_outcome(users_ctrl_c_rewrapped)
    with pytest.raises(Terminated):  # SIGTERM's stop is never a reward's failure

        def terminated() -> float:
            raise Terminated()

        reward_outcome(terminated)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_an_interrupt_is_the_rewards():
    seen: list[object] = []
    worker = threading.Thread(target=lambda: seen.append(reward_outcome(own_interrupt)[1]))
    worker.start()
    worker.join()
    assert type(seen[0]) is KeyboardInterrupt


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    return path


@pytest.mark.parametrize(("reward", "worker"), [  # one quick; the others are fits of their own, slow
    pytest.param("interrupting", False, marks=pytest.mark.slow), ("interrupting", True),
    pytest.param("exiting", True, marks=pytest.mark.slow)], ids=["interrupt-in-process", "interrupt-in-worker",
                                                                 "exit-in-worker"])
def test_a_reward_raising_interrupt_or_exit_is_named_and_the_run_finishes(reward, worker, tmp_path, capfd, recwarn):
    args = ["fit", "--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--trainer.max_epochs", "1",
            "--trainer.default_root_dir", str(tmp_path), *SMALL, "--data.task", "lit_grpo.tasks.DatasetTask",
            "--data.task.path", str(prompts_file(tmp_path)), "--data.task.failure_reward", "0",
            "--data.task.rewards", f'["tests.helpers_rewards.{reward}"]']
    main(args + (["--data.reward_timeout", "30"] if worker else []))  # returns: the run finished
    raised = ("KeyboardInterrupt: the reward's own interrupt" if reward == "interrupting"
              else "SystemExit: the reward gave up")
    warned = [str(w.message) for w in recwarn if "reward error" in str(w.message)]
    assert warned and all(m.startswith("reward error on 4 of 4 completion(s), scored 0.0 (rollout/reward_errors):\n"
                                       f"  {reward}: {raised} (on 4 completion(s)") for m in warned), warned
    assert "Traceback" not in capfd.readouterr().err  # no worker died printing one; no Ctrl-C taken for the user's
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()  # the run's end: the final adapter
    where = "in the reward worker (`data.reward_timeout`)" if worker else "in the trainer's process"
    documented(f"a reward raising `{raised.split(':')[0]}` itself, {where}",
               f"exit 0, no traceback; a reward error on each completion ({reward}: {raised}), scored failure_reward, "
               "named in the epoch's reward-error warning; the run finished and saved its adapter",
               "test_hostile_rewards.py")
