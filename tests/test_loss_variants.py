"""The table of loss variants (losses/variants.py): its keys are the ``Literal``, each row's defaults are what the
objective takes, a row's formula and statistics are what ``policy_loss`` applies and the metrics log (no list of
names), its knobs come through ``model.loss_knobs`` (the old ``sapo`` / ``vespo`` with a deprecation), and a variant
defined here, formula and row in a package of its own, trains through ``lit-grpo fit --model.loss_variant`` with its
statistic logged (CONTRIBUTING.md, "Adding a loss")."""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import textwrap
import typing
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from lit_grpo.cli.config_check import signature_defaults
from lit_grpo.losses import policy_loss
from lit_grpo.losses.surrogates import SapoTemperatures, VespoShape
from lit_grpo.losses.variants import (
    BUILT_IN,
    ENTRY_POINT_GROUP,
    VARIANTS,
    LossVariant,
    PolicyVariant,
    with_entry_points,
)
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.objective import Objective, module_config_problems, warn_deprecated_knobs

ROOT = Path(__file__).resolve().parents[1]
F64 = torch.float64

# a variant of the tests' own: half the unclipped surrogate (its knob the factor), with one statistic
VARIANT_SOURCE = '''
from dataclasses import dataclass

from lit_grpo.losses.variants import LossVariant


@dataclass(frozen=True)
class Scale:
    factor: float = 0.5


HALF = LossVariant(lambda x: -x.knobs.factor * x.adv * x.ratio, knobs=Scale,
                   statistics=lambda x: {"halfclip/factor": x.logp.new_tensor(x.knobs.factor)})
'''


@dataclass(frozen=True)
class Scale:
    factor: float = 0.5


HALF = LossVariant(lambda x: -x.knobs.factor * x.adv * x.ratio, knobs=Scale,
                   statistics=lambda x: {"halfclip/factor": x.logp.new_tensor(x.knobs.factor)})
NOT_A_ROW = object()


def args(**given: object) -> dict:
    return {**signature_defaults(PolicyModule), **given}


def test_the_literal_is_the_tables_keys_and_the_module_adds_dpo():
    assert typing.get_args(PolicyVariant) == tuple(VARIANTS) == (
        "reinforce", "unclipped", "clip", "gspo", "cispo", "sapo", "luspo", "vespo")
    hint = typing.get_type_hints(PolicyModule.__init__)["loss_variant"]
    assert typing.get_args(hint) == (*VARIANTS, "dpo")


@pytest.mark.parametrize(("variant", "given", "expected"), [
    # (clip_eps, clip_eps_high, aggregation, ratio level) with nothing set, as each row says
    ("reinforce", {}, (0.2, 0.2, "seq-mean", "token")),
    ("unclipped", {}, (0.2, 0.2, "seq-mean", "token")),
    ("clip", {}, (0.2, 0.2, "seq-mean", "token")),
    ("gspo", {}, (3e-4, 4e-4, "seq-mean", "sequence")),
    ("cispo", {}, (0.2, 4.0, "token-mean", "token")),
    ("sapo", {}, (0.2, 0.2, "seq-mean", "token")),
    ("luspo", {}, (3e-4, 4e-4, "seq-sum", "sequence")),
    ("vespo", {}, (0.2, 0.2, "token-mean", "token")),
    ("dpo", {}, (0.2, 0.2, "seq-mean", None)),
    # one epsilon set: GSPO's pair only when neither is, CISPO's cap whenever the high one is unset
    ("gspo", {"clip": {"eps": 0.1}}, (0.1, 0.1, "seq-mean", "sequence")),
    ("gspo", {"clip": {"eps_high": 0.3}}, (0.2, 0.3, "seq-mean", "sequence")),
    ("cispo", {"clip": {"eps": 0.1}}, (0.1, 4.0, "token-mean", "token")),
    ("clip", {"clip": {"eps_high": 0.28}, "aggregation": "token-mean", "ratio_level": "sequence"},
     (0.2, 0.28, "token-mean", "sequence")),
])
def test_each_rows_defaults_are_the_objectives(variant, given, expected):
    objective = Objective.from_arguments(args(loss_variant=variant, **given))
    level = None if variant == "dpo" else objective.surrogate.level(variant)
    assert (objective.clip_eps, objective.clip_eps_high, objective.aggregation, level) == expected


def test_a_row_is_applied_as_it_says(monkeypatch):
    monkeypatch.setitem(VARIANTS, "halfclip", HALF)
    # one token, ratio 1.2, A = 1, factor 0.5: -0.6; with a sampler ratio 2 multiplied on: -1.2; the figures with it
    logp = torch.tensor([[math.log(0.6)]], dtype=F64, requires_grad=True)
    old, adv, mask = torch.tensor([[math.log(0.5)]], dtype=F64), torch.tensor([1.0], dtype=F64), torch.ones(1, 1).bool()
    loss, stats = policy_loss(logp, old, adv, mask, "halfclip")
    assert loss.item() == pytest.approx(-0.6, abs=1e-12)
    assert stats["halfclip/factor"].item() == 0.5 and stats["ratio_mean"].item() == pytest.approx(1.2, abs=1e-12)
    loss, _ = policy_loss(logp, old, adv, mask, "halfclip", sampler_ratio=torch.tensor([[2.0]], dtype=F64))
    assert loss.item() == pytest.approx(-1.2, abs=1e-12)
    with pytest.raises(ValueError, match="unknown loss variant 'halfclap'; valid choices: reinforce, "):
        policy_loss(logp, old, adv, mask, "halfclap")


def test_entry_points_add_rows_and_a_clash_or_another_object_is_named():
    point = EntryPoint("halfclip", f"{__name__}:HALF", ENTRY_POINT_GROUP)
    table = with_entry_points(BUILT_IN, [point])
    assert list(table) == [*BUILT_IN, "halfclip"] and table["halfclip"] is HALF
    with pytest.raises(ImportError, match=r"entry point clip = .*: loss variant 'clip' exists already"):
        with_entry_points(BUILT_IN, [EntryPoint("clip", f"{__name__}:HALF", ENTRY_POINT_GROUP)])
    with pytest.raises(ImportError, match=r"expected a lit_grpo.losses.variants.LossVariant, got object"):
        with_entry_points(BUILT_IN, [EntryPoint("other", f"{__name__}:NOT_A_ROW", ENTRY_POINT_GROUP)])


def test_loss_knobs_take_the_rows_knob_type_and_the_old_names_still_work():
    assert Objective.from_arguments(args(loss_variant="sapo", loss_knobs={"pos": 2.0})).surrogate.knobs == \
        SapoTemperatures(2.0, 1.05)
    assert Objective.from_arguments(args(loss_variant="vespo")).surrogate.knobs == VespoShape()
    assert Objective.from_arguments(args(loss_variant="clip")).surrogate.knobs is None
    old = args(loss_variant="sapo", sapo={"pos": 2.0})
    assert Objective.from_arguments(old).surrogate.knobs == SapoTemperatures(2.0, 1.05)
    with pytest.warns(FutureWarning, match="model.sapo is deprecated and goes in the next release; set "
                                           "model.loss_knobs"):
        warn_deprecated_knobs(old)
    assert module_config_problems(old) == []
    assert module_config_problems(args(loss_variant="sapo", loss_knobs={"pos": -1.0})) == [
        "loss_knobs.pos: must be positive, got -1.0"]
    (unknown,) = module_config_problems(args(loss_variant="vespo", loss_knobs={"k": 1.0}))
    assert unknown.startswith("loss_knobs: ") and unknown.endswith(
        "fields of VespoShape: k_pos, lambda_pos, k_neg, lambda_neg")
    assert module_config_problems(args(loss_knobs={"pos": 2.0})) == [
        "loss_knobs with loss_variant 'clip': it takes no knobs; leave it unset"]
    assert module_config_problems(args(loss_variant="sapo", sapo={"pos": 2.0}, loss_knobs={"pos": 3.0})) == [
        "sapo and loss_knobs: sapo is loss_knobs' old name; give loss_knobs only"]


def test_every_statistic_the_step_returns_is_logged_under_its_own_name():
    from lit_grpo.callbacks import RolloutMetrics

    class Module:
        device = torch.device("cpu")

        def __init__(self) -> None:
            self.logged: dict[str, float] = {}

        def log(self, name: str, value: object, **kwargs: object) -> None:
            self.logged[name] = float(value)

    metrics, module = RolloutMetrics(), Module()
    for factor in (0.25, 0.75):  # two minibatches: the epoch's mean
        stats = {"halfclip/factor": torch.tensor(factor), "logp_diff_max": torch.tensor(factor)}
        metrics.on_train_batch_end(None, module, {"loss": torch.tensor(0.0), "stats": stats}, None, 1)
    metrics.on_train_epoch_end(None, module)
    assert module.logged == {"train/halfclip/factor": 0.5, "rollout/logp_diff_max": 0.75}


@pytest.mark.slow
def test_a_variant_of_its_own_package_trains_through_the_command_with_its_statistic_logged(tmp_path):
    package = tmp_path / "site"
    (package / "halfclip_variant.py").parent.mkdir()
    (package / "halfclip_variant.py").write_text(textwrap.dedent(VARIANT_SOURCE))
    info = package / "halfclip_variant-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: halfclip-variant\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nhalfclip = halfclip_variant:HALF\n")
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs" / "quickstart.yaml"),
               "--model.loss_variant", "halfclip", "--model.loss_knobs", '{"factor": 0.25}',
               "--trainer.max_epochs", "1", "--trainer.num_sanity_val_steps", "0", "--trainer.limit_val_batches", "0",
               "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path),
               "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path),
               "--data.prompts_per_epoch", "8"]
    paths = [str(package), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (log,) = tmp_path.glob("**/metrics.csv")
    with log.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row["train/halfclip/factor"]) for row in rows if row.get("train/halfclip/factor")] == [0.25]
    assert all(math.isfinite(float(row["train/loss_epoch"])) for row in rows if row.get("train/loss_epoch"))
