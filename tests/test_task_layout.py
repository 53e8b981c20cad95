"""tasks/ by kind (issue 60 item 2): the old class paths still load, through the command's config check and
instantiation as through Python, and every multi-round task has one episode interface (``turn``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from lit_grpo.cli.config_check import config_problems

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# every public name of the flat layout a config or a user's code could name, as (old module, name, new module)
OLD_PATHS = [
    ("lit_grpo.tasks.tool_task", "ToolTask", "lit_grpo.tasks.tools.task"),
    ("lit_grpo.tasks.tool_arithmetic", "Registers", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "RegisterNote", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "ArithmeticEnvironment", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "add", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "multiply", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "exact_answer", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "register_answer", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_arithmetic", "replayed_answer", "lit_grpo.tasks.tools.arithmetic"),
    ("lit_grpo.tasks.tool_stock", "Stockroom", "lit_grpo.tasks.tools.stock"),
    ("lit_grpo.tasks.games", "HiddenOperandsTask", "lit_grpo.tasks.games.operands"),
    ("lit_grpo.tasks.games", "CalculatorTask", "lit_grpo.tasks.games.calculator"),
    ("lit_grpo.tasks.stale_digits", "StaleDigitsTask", "lit_grpo.tasks.games.stale_digits"),
    ("lit_grpo.tasks.multiround", "ClarifyTask", "lit_grpo.tasks.games.operands"),
    ("lit_grpo.tasks.multiround", "AskOrAnswerTask", "lit_grpo.tasks.games.ask_or_answer"),
    ("lit_grpo.tasks.multiround", "MultiRoundTask", "lit_grpo.tasks.episodes"),
    ("lit_grpo.tasks.multiround", "EnvStep", "lit_grpo.tasks.episodes"),
    ("lit_grpo.tasks.arithmetic", "ArithmeticTask", "lit_grpo.tasks.single_turn.arithmetic"),
    ("lit_grpo.tasks.sort", "SortTask", "lit_grpo.tasks.single_turn.sort"),
    ("lit_grpo.tasks.sort", "SortDistanceReward", "lit_grpo.tasks.single_turn.sort"),
    ("lit_grpo.tasks.dataset", "DatasetTask", "lit_grpo.tasks.single_turn.dataset"),
    ("lit_grpo.tasks.jsonl", "JsonlTask", "lit_grpo.tasks.single_turn.jsonl"),
    ("lit_grpo.tasks.math_answers", "MathVerify", "lit_grpo.tasks.rewards.math_answers"),
    ("lit_grpo.tasks.reward_functions", "BatchedReward", "lit_grpo.tasks.rewards.functions"),
    ("lit_grpo.tasks.reward_model", "RewardModel", "lit_grpo.tasks.rewards.model"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_PATHS, ids=lambda x: x.removeprefix("lit_grpo.tasks."))
def test_an_old_path_names_the_object_at_its_new_path(old, name, new):
    found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(new), name)
    assert found.__module__ == new  # defined once, where it lives now


def old_paths(text: str, replacements: dict[str, str]) -> str:
    """A config's text with each new class path written as it was before tasks/ was grouped by kind."""
    for new, old in replacements.items():
        assert new in text  # the shipped config names the new path
        text = text.replace(new, old)
    return text


@pytest.mark.parametrize(("config", "replacements", "task_class"), [
    ("tools.yaml", {"lit_grpo.tasks.tools.task.ToolTask": "lit_grpo.tasks.tool_task.ToolTask",
                    "lit_grpo.tasks.tools.arithmetic.": "lit_grpo.tasks.tool_arithmetic."}, "ToolTask"),
    ("hidden_risk.yaml", {"lit_grpo.tasks.games.operands.HiddenOperandsTask": "lit_grpo.tasks.games.HiddenOperandsTask"},
     "HiddenOperandsTask"),
], ids=["tool_task", "games"])
def test_a_config_written_with_the_old_class_paths_passes_the_check_and_instantiates(config, replacements, task_class,
                                                                                      tmp_path, monkeypatch):
    from lit_grpo.cli import LitGRPOCLI

    monkeypatch.chdir(tmp_path)  # relative model paths resolve against the checkout
    path = tmp_path / config
    path.write_text(old_paths((CONFIGS / config).read_text(), replacements))
    assert config_problems(yaml.safe_load(path.read_text())) == []
    cli = LitGRPOCLI(args=["--config", str(path)], run=False)
    assert type(cli.datamodule.task).__name__ == task_class
    if task_class == "ToolTask":
        from lit_grpo.tasks.tools.arithmetic import Registers, register_answer

        assert cli.datamodule.task.rewards == [register_answer] and cli.datamodule.task.factories == {None: Registers}


def test_every_multi_round_task_implements_turn_and_a_game_its_step():
    from lit_grpo.tasks import ClarifyTask, GameTask, MultiRoundTask
    from lit_grpo.tasks.tools.task import ToolTask

    assert "turn" in MultiRoundTask.__abstractmethods__ and not hasattr(MultiRoundTask, "step")
    assert "step" in GameTask.__abstractmethods__ and "turn" not in GameTask.__abstractmethods__
    assert not hasattr(ToolTask, "step") and not hasattr(MultiRoundTask, "owns_turns")
    assert (ToolTask.reuses_turn_cache.fget(None), ClarifyTask().reuses_turn_cache) == (True, False)
    task = ClarifyTask()
    record = {"prompt": "12+?=", "answer": "37", "a": 12, "b": 25, "hidden": True}
    assert task.turn(record, None, 1, "?", None, False) == task.step(record, 1, "?")
    assert task.turn(record, None, 2, "37", None, False).reward == 1.0


def test_the_rules_read_what_a_task_declares_not_a_flag():
    from lit_grpo.cli.config_check import signature_defaults
    from lit_grpo.rollout.datamodule import RolloutDataModule
    from lit_grpo.run.rules import multi_round_problems
    from lit_grpo.tasks import ClarifyTask, MultiRoundTask

    class Mute(ClarifyTask):  # a game that names no first tokens that defer
        defer_token_ids = None

    class Stateful(MultiRoundTask):  # a turn that needs its episode: no step
        max_rounds, no_answer_reward, malformed_reward = 2, -1.0, -1.0

        def split(self):
            return [], [], []

        def turn(self, prompt_record, episode, round_index, segment_text, tokenizer, truncated, segment_ids=(),
                 context_ids=()):
            return None

    data = signature_defaults(RolloutDataModule)
    assert multi_round_problems({**data, "rollout": "grouped"}, ClarifyTask) == []
    assert multi_round_problems({**data, "rollout": "grouped"}, Stateful) == [
        "data.task Stateful runs episodes over turns: use data.rollout 'chains' (group-relative on each episode's "
        "return, TRL's multi-turn GRPO) or 'tree' (branching at every turn)"]
    tree = {**data, "rollout": "tree", "branching": [2, 2, 2]}
    assert multi_round_problems(tree, ClarifyTask, {"risk": {"atoms": 5}}) == []
    assert multi_round_problems(tree, Mute, {"risk": {"atoms": 5}}) == [
        "model.risk with data.task Mute: the risk head needs a task that names the first tokens that defer (a "
        "defer_token_ids(tokenizer) method); a tool task's turns are read by its template's parser"]
