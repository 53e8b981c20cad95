"""Every row of the feature table (lit_grpo.run.rules) with every rollout kind: one epoch on the tiny model
where the kind implements the feature, a refusal naming both knobs before any weights load where it does not
(issue 18, bug 2: DPO with trees died after generation with KeyError('pair_role'); tis_cap, dynamic_sampling,
mask_truncated, overlong_cache and reward_timeout were silently ignored with trees or chains)."""

from __future__ import annotations

from pathlib import Path

import pytest
from lit_grpo.run.rules import FEATURES, ROLLOUTS
from support import weight_reads

from lit_grpo.cli import main

ROOT = Path(__file__).resolve().parents[1]
ON = {"model.loss_variant": "dpo", "model.advantage_mode": "gae", "model.kl_in": "reward", "model.tis_cap": "2.0",
      "data.dynamic_sampling": "true", "data.mask_truncated": "true", "data.overlong_cache": "2",
      "data.reward_timeout": "5.0", "model.tree_std_scope": "siblings", "model.risk": '{"v_min": -1.0, "v_max": 1.0, "num_atoms": 5}'}
SMALL = ["--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
         "--trainer.enable_model_summary", "false", "--data.max_new_tokens", "4"]
KIND = {
    "grouped": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama"), "--data.group_size", "4",
                "--data.prompts_per_epoch", "2", "--data.minibatch_size", "8"],
    "tree": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama-clarify"), "--data.task",
             "lit_grpo.tasks.ClarifyTask", "--data.rollout", "tree", "--data.branching", "[2, 2]",
             "--data.prompts_per_epoch", "2", "--data.minibatch_size", "64"],
    "chains": ["--model.model_name_or_path", str(ROOT / "data" / "tiny-llama-clarify"), "--data.task",
               "lit_grpo.tasks.ClarifyTask", "--data.rollout", "chains", "--data.branching", "[2, 2]",
               "--data.group_size", "2", "--data.prompts_per_epoch", "2", "--data.minibatch_size", "64"],
}
RISK_CALLBACK = ['--trainer.callbacks+={"class_path": "lit_grpo.callbacks.RiskThreshold"}']


def test_the_table_names_every_rollout_kind_and_a_setting_for_every_feature():
    assert {kind for f in FEATURES for kind in f.rollouts} == set(ROLLOUTS) == set(KIND)
    assert set(ON) == {f.knob for f in FEATURES}


@pytest.mark.parametrize("rollout", ROLLOUTS)
@pytest.mark.parametrize("feature", FEATURES, ids=[f.knob for f in FEATURES])
def test_each_feature_with_each_rollout_kind_runs_or_is_refused_up_front(feature, rollout, tmp_path, capsys,
                                                                        monkeypatch):
    knob = feature.knob
    args = ["fit", *KIND[rollout], f"--{knob}", ON[knob], "--trainer.default_root_dir", str(tmp_path),
            "--trainer.logger", "false", *SMALL]
    if knob == "model.risk":
        args += RISK_CALLBACK
    if rollout in feature.rollouts:
        main(args)
        assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
        return
    reads = weight_reads(monkeypatch)
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and not reads
    assert f"{knob} " in err and f"with data.rollout {rollout!r}: {feature.why}" in err
