"""Every YAML in configs/ parses, passes the config check and instantiates through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lit_grpo.cli import LitGRPOCLI
from lit_grpo.cli.config_check import config_problems
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.policy.module import PolicyModule

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_there_are_configs():
    assert {"quickstart.yaml", "quickstart_vllm.yaml", "sort.yaml", "clarify_tree.yaml", "clarify_chains.yaml", "ppo.yaml",
            "dpo_online.yaml", "dapo.yaml", "quickstart_server.yaml"} <= {
        path.name for path in CONFIGS
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_instantiates(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative model paths must still resolve (against the checkout)
    assert config_problems(yaml.safe_load(path.read_text())) == []
    cli = LitGRPOCLI(args=["--config", str(path)], run=False)
    assert isinstance(cli.model, PolicyModule) and isinstance(cli.datamodule, RolloutDataModule)
    assert cli.trainer.reload_dataloaders_every_n_epochs == 1
    assert cli.model.policy is None  # the model loads in configure_model, not at instantiation


def test_checkpointing_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from lightning.pytorch.callbacks import ModelCheckpoint

    path = CONFIGS[0]
    cli = LitGRPOCLI(args=["--config", str(path), "--trainer.enable_checkpointing", "false"], run=False)
    assert not any(isinstance(c, ModelCheckpoint) for c in cli.trainer.callbacks)
    cli = LitGRPOCLI(args=["--config", str(path)], run=False)
    assert [c.filename for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)] == ["last"]
