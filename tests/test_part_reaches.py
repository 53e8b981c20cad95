"""Design §1's parts meet through declared contracts (issue 51): ``scripts/part_reaches.py`` finds every attribute read
or write on another part's object that its contract does not declare, and the package has none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from part_reaches import all_reaches, reaches_in  # noqa: E402 - the maintainer's script: one copy of the check

HEADER = """
from typing import Any
import lightning.pytorch as pl
from lit_grpo.buffers.protocols import TakesRiskThreshold
from lit_grpo.engines import RolloutEngine
from lit_grpo.tasks import Task
"""


@pytest.mark.slow
def test_no_part_reaches_into_another_past_its_contract():
    assert [str(reach) for reach in all_reaches()] == []


def found(source: str, where: str = "callbacks/planted.py") -> list[tuple[str, str]]:
    """``(kind, expression)`` of each reach in ``source`` placed at ``where``."""
    return [(reach.kind, reach.text) for reach in reaches_in(ROOT / where, HEADER + source)]


@pytest.mark.parametrize("source, reach", [
    ("def hook(trainer: pl.Trainer, pl_module: Any):\n    return pl_module.risk_head\n",
     ("read", "pl_module.risk_head")),
    ("def hook(trainer: pl.Trainer, pl_module: pl.LightningModule):\n    pl_module.reference_source = 1\n",
     ("write", "pl_module.reference_source")),
    ("def hook(trainer: pl.Trainer, pl_module: Any):\n    return trainer.datamodule.val_records()\n",
     ("read", "trainer.datamodule.val_records")),
    ("def hook(trainer: pl.Trainer, pl_module: Any):\n    data = trainer.datamodule\n    return data.engine\n",
     ("read", "data.engine")),
    ("class Hooks:\n    def hook(self):\n        return self.trainer.lightning_module.policy\n",
     ("read", "self.trainer.lightning_module.policy")),
    ("def record(task: Any):\n    return getattr(task, 'path', None)\n", ("read", "getattr(task, 'path', None)")),
    ("def copies(engine: Any, name: str):\n    return getattr(engine, name, False)\n",
     ("read", "getattr(engine, name, False)")),
    ("def record(task: Task):\n    return task.path\n", ("read", "task.path")),
    ("def draw(engine: RolloutEngine):\n    engine.pushed = True\n", ("write", "engine.pushed")),
    ("def draw(engine: RolloutEngine):\n    return engine._server\n", ("read", "engine._server")),
])
def test_a_planted_reach_is_found(source, reach):
    assert found(source) == [reach]


@pytest.mark.parametrize("source", [
    "def hook(trainer: pl.Trainer, pl_module: Any):\n    pl_module.log('x', 1.0)\n    return trainer.global_step\n",
    "def hook(trainer: pl.Trainer, pl_module: Any):\n    data = trainer.datamodule\n"
    "    if isinstance(data, TakesRiskThreshold):\n        data.use_risk_threshold(None)\n",
    "def record(task: Task):\n    return task.train_records(), type(task).__name__\n",
    "def draw(engine: RolloutEngine):\n    return engine.generate([[1]], 1, None)\n",
])
def test_what_a_contract_declares_is_no_reach(source):
    assert found(source) == []


def test_a_parts_own_objects_are_its_own_business():
    # a task's own part may use what its classes keep (the check is about crossing parts)
    assert found("def record(task: Task):\n    return task.path\n", where="lit_grpo/tasks/planted.py") == []
