"""PolicyModule's knobs in groups (``lora``, ``kl``, ``clip``, ``tree``, ``value``, ``memory``; issue 60 item 6):
the grouped and the old flat spelling give the same module, the old one warns with the new name, both together are
refused, a checkpoint and a config written with the flat names still resume and validate, and ``--help`` lists the
groups' fields."""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from lit_grpo.cli import main
from lit_grpo.cli.config_check import config_problems
from lit_grpo.errors import InputError
from lit_grpo.losses.policy import SurrogateOptions
from lit_grpo.policy.advantages import AdvantageKnobs
from lit_grpo.policy.knob_groups import GROUPS, regroup
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.objective import Objective
from lit_grpo.run.objective_knobs import FLAT_NAMES, dotted
from lit_grpo.run.resume import resume_differences

ROOT = Path(__file__).resolve().parents[1]
GROUPED = {"lora": {"rank": 8, "alpha": 16.0, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
           "kl": {"coef": 0.1, "estimator": "k1", "applied_to": "reward", "ratio_correction": False},
           "clip": {"eps": 0.1, "eps_high": 0.3, "delta": 3.0},
           "tree": {"value_mode": "optimal_stopping", "std_scope": "siblings", "flat_groups": "drop"},
           "value": {"coef": 0.25, "clip": None, "gamma": 0.9, "gae_lambda": 0.8},
           "memory": {"gradient_checkpointing": True, "logprob_chunk_tokens": 64, "no_grad_batch_tokens": 512,
                      "packed_forward": False}}
FLAT = {"lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.1, "lora_target_modules": ["q_proj", "v_proj"],
        "kl_coef": 0.1, "kl_estimator": "k1", "kl_in": "reward", "clip_eps": 0.1, "clip_eps_high": 0.3,
        "clip_delta": 3.0, "tree_value_mode": "optimal_stopping", "tree_std_scope": "siblings",
        "tree_flat_groups": "drop", "vf_coef": 0.25, "vf_clip": None, "gamma": 0.9, "gae_lambda": 0.8,
        "gradient_checkpointing": True, "logprob_chunk_tokens": 64, "no_grad_batch_tokens": 512,
        "packed_forward": False}


def built(**arguments: object) -> tuple[PolicyModule, list[str]]:
    """A module of ``arguments`` (no weights load before ``configure_model``) and the FutureWarnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = PolicyModule(**arguments)
    return module, [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_the_grouped_and_the_flat_spelling_give_the_same_hyper_parameters_and_objective():
    grouped, said = built(**GROUPED)
    flat, _ = built(**FLAT)
    assert said == []
    assert dict(flat.hparams) == dict(grouped.hparams)
    assert {name: grouped.hparams[name] for name in GROUPED} == GROUPED  # each group whole, as given
    assert not set(grouped.hparams) & {"lora_rank", "kl_coef", "vf_clip", "packed_forward"}  # no flat name kept
    expected = Objective(advantage_mode="grpo", variant="clip", clip_eps=0.1, clip_eps_high=0.3,
                         aggregation="seq-mean", kl_coef=0.1, kl_estimator="k1", kl_in="reward",
                         surrogate=SurrogateOptions(None, 3.0, None))
    assert flat.objective == grouped.objective == expected
    knobs = AdvantageKnobs("group", "optimal_stopping", "siblings", 0.9, 0.8, False, "drop", "episode")
    assert AdvantageKnobs.of(flat.hparams, False) == AdvantageKnobs.of(grouped.hparams, False) == knobs


def test_a_partial_group_keeps_its_other_fields_defaults():
    module, _ = built(kl={"coef": 0.0}, value={"clip": None})
    assert module.hparams["kl"] == {"coef": 0.0, "estimator": "k3", "applied_to": "loss", "ratio_correction": False}
    assert module.hparams["value"] == {"coef": 0.5, "clip": None, "gamma": 1.0, "gae_lambda": 0.95}
    assert module.hparams["lora"] == {"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}


def test_each_flat_name_defaults_to_its_fields_default():
    # a flat name fills its field only away from its default: the two defaults must be the same value
    signature = inspect.signature(PolicyModule.__init__).parameters
    defaults = {name: {f.name: f.default for f in dataclasses.fields(cls)} for name, cls in GROUPS.items()}
    assert len(FLAT_NAMES) == 22 == sum(len(fields) for fields in defaults.values())
    assert {old: signature[old].default for old in FLAT_NAMES} == {
        old: defaults[new.split(".")[0]][new.split(".")[1]] for old, new in FLAT_NAMES.items()}
    assert defaults["kl"]["coef"] == 0.04 and defaults["value"]["clip"] == 0.2 and defaults["lora"]["rank"] == 16


def test_the_old_spelling_warns_once_per_name_with_the_new_one():
    module, said = built(kl_coef=0.0, lora_rank=8, vf_clip=None, kl_estimator="k3")  # k3: the default, unset
    assert said == [
        "PolicyModule: model.lora_rank is deprecated and goes in the next release; set model.lora.rank instead",
        "PolicyModule: model.kl_coef is deprecated and goes in the next release; set model.kl.coef instead",
        "PolicyModule: model.vf_clip is deprecated and goes in the next release; set model.value.clip instead"]
    assert (module.hparams["kl"]["coef"], module.hparams["lora"]["rank"], module.hparams["value"]["clip"]) == (
        0.0, 8, None)


def test_both_spellings_of_one_knob_are_refused_in_one_message():
    with pytest.raises(InputError) as refused:
        PolicyModule(kl_coef=0.1, kl={"coef": 0.2}, lora={"rank": 4}, lora_rank=8, clip={"eps": -1.0})
    assert str(refused.value) == (
        "invalid PolicyModule configuration:\n"
        "  - lora_rank: the old name of lora.rank, which is given too; give lora.rank only\n"
        "  - kl_coef: the old name of kl.coef, which is given too; give kl.coef only\n"
        "  - clip.eps: must be positive, got -1.0")
    # the command's check, before anything is built; two different knobs of one group are no conflict
    assert config_problems({"model": {"kl_coef": 0.1, "kl": {"coef": 0.2}}}) == [
        "model.kl_coef: the old name of kl.coef, which is given too; give kl.coef only"]
    assert config_problems({"model": {"kl_coef": 0.0, "kl": {"estimator": "k1"}}}) == []


def test_a_groups_unknown_field_and_bad_choice_are_named():
    assert regroup({"kl": {"coeff": 0.1}}).problems[0].startswith("kl: KLPenalty.__init__() got an unexpected keyword "
                                                                   "argument 'coeff'; fields: coef, estimator, "
                                                                   "applied_to, ratio_correction")
    assert regroup({"tree": {"std_scope": "forest"}}).problems == [
        "tree.std_scope: unknown value 'forest'; valid choices: tree, siblings, none"]


def test_every_shipped_config_uses_the_groups():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        model = yaml.safe_load(path.read_text()).get("model") or {}
        assert not set(model) & set(FLAT_NAMES), path.name
        assert regroup(model).flat_names == [], path.name


def test_a_checkpoints_flat_names_are_compared_with_this_runs_groups():
    saved = {"model_name_or_path": "data/tiny-llama", "lora_rank": 16, "lora_target_modules": "all-linear",
             "kl_coef": 0.04, "vf_clip": None, "advantage_mode": "grpo"}
    current = {"model_name_or_path": "data/tiny-llama", "advantage_mode": "grpo",
               "lora": {"rank": 8, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"},
               "kl": {"coef": 0.5, "estimator": "k3"}, "value": {"clip": 0.2}}
    assert dotted(saved) == {"model_name_or_path": "data/tiny-llama", "lora.rank": 16,
                             "lora.target_modules": "all-linear", "kl.coef": 0.04, "value.clip": None,
                             "advantage_mode": "grpo"}
    assert resume_differences(saved, current) == (
        ["model.lora.rank: the checkpoint was trained with 16, this run asks for 8"],
        ["model.kl.coef: 0.04 in the checkpoint, 0.5 now (this run's value is used)",
         "model.value.clip: None in the checkpoint, 0.2 now (this run's value is used)"])


def test_help_lists_every_groups_fields_and_each_flat_names_new_spelling(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--help"])
    assert stop.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    for name, cls in GROUPS.items():
        for field in dataclasses.fields(cls):
            assert f"--model.{name}.{field.name} " in shown, (name, field.name)
    assert "--model.kl.coef COEF beta, the weight of the KL to the reference policy" in shown
    assert "--model.kl_in {loss,reward} deprecated, goes in the next release: kl.applied_to." in shown
    assert "--model.vf_clip VF_CLIP deprecated, goes in the next release: value.clip." in shown


# --- a run written before the groups: its checkpoint and its config.yaml hold the flat names --------------------------
SMALL = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false", "--data.prompts_per_epoch", "2",
         "--data.group_size", "2", "--data.minibatch_size", "4", "--data.max_new_tokens", "3",
         "--data.val_max_prompts", "2"]


@pytest.fixture(scope="module")
def old_run(tiny_llama_dir, tmp_path_factory) -> Path:
    """One epoch's checkpoint with its hyper-parameters rewritten as lit-grpo wrote them before the groups (every
    knob by its flat name), beside a config file in the flat names."""
    root = tmp_path_factory.mktemp("old-run")
    main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--model.lora.rank", "8",
          "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(root),
          *SMALL])
    checkpoint = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    new = checkpoint["hyper_parameters"]
    checkpoint["hyper_parameters"] = {
        **{name: value for name, value in new.items() if name not in ("lora", "kl", "clip", "tree", "value", "memory")},
        "lora_rank": 8, "lora_alpha": 32.0, "lora_dropout": 0.0, "lora_target_modules": "all-linear",
        "kl_coef": 0.04, "kl_estimator": "k3", "kl_in": "loss", "kl_ratio_correction": False, "clip_eps": None,
        "clip_eps_high": None, "clip_delta": None, "tree_value_mode": "mean", "tree_std_scope": "tree",
        "tree_flat_groups": "count", "vf_coef": 0.5, "vf_clip": 0.2, "gamma": 1.0, "gae_lambda": 0.95,
        "gradient_checkpointing": False, "logprob_chunk_tokens": 256, "no_grad_batch_tokens": 16384,
        "packed_forward": True}
    torch.save(checkpoint, root / "old.ckpt")
    (root / "old.yaml").write_text(f"model:\n  model_name_or_path: {tiny_llama_dir}\n  lora_rank: 8\n  kl_coef: 0.04\n")
    return root


@pytest.mark.slow
def test_a_flat_name_checkpoint_validates_and_resumes(old_run, tiny_llama_dir, tmp_path, capsys):
    validate = ["validate", "--config", str(old_run / "old.yaml"), "--ckpt_path", str(old_run / "old.ckpt"),
                "--trainer.default_root_dir", str(tmp_path / "validate"), *SMALL]
    main(validate)  # run/sweep's call: the run's config and one of its checkpoints
    assert "cannot" not in capsys.readouterr().err
    resume = ["fit", "--config", str(old_run / "old.yaml"), "--ckpt_path", str(old_run / "old.ckpt"),
              "--trainer.max_epochs", "2", "--trainer.limit_val_batches", "0", "--model.kl.coef", "0.5",
              "--trainer.default_root_dir", str(tmp_path / "resume"), *SMALL]
    main(resume)
    err = capsys.readouterr().err
    assert "model.kl.coef: 0.04 in the checkpoint, 0.5 now (this run's value is used)" in err
    saved = torch.load(tmp_path / "resume" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["epoch"] == 1 and saved["hyper_parameters"]["kl"]["coef"] == 0.5
    assert saved["hyper_parameters"]["lora"]["rank"] == 8 and "lora_rank" not in saved["hyper_parameters"]
    with pytest.warns(FutureWarning, match="model.lora_rank is deprecated"):  # the Python API reads them too
        loaded = PolicyModule.load_from_checkpoint(old_run / "old.ckpt")
    assert loaded.hparams["lora"]["rank"] == 8 and loaded.policy.peft_config["default"].r == 8
    with pytest.raises(SystemExit) as refused:  # a shape-changing knob, by its new name against the old one
        main(["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--model.lora.rank", "4", "--ckpt_path",
              str(old_run / "old.ckpt"), "--trainer.max_epochs", "2", "--trainer.default_root_dir",
              str(tmp_path / "refused"), *SMALL])
    assert refused.value.code == 2
    assert "model.lora.rank: the checkpoint was trained with 8, this run asks for 4" in capsys.readouterr().err
