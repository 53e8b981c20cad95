"""Every argument form that Lightning's CLI documentation gives for callbacks, optimizers and schedulers (issue 47)
builds through ``lit-grpo`` what a plain ``LightningCLI`` over the same module and data module builds: the same
callbacks with the same settings, the same optimizer and scheduler. The configuration check still lists every
problem of a refused input at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from lit_grpo.cli import TRAINER_DEFAULTS, LitGRPOCLI, main
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule

ROOT = Path(__file__).resolve().parents[1]
EARLY = "lightning.pytorch.callbacks.EarlyStopping"
SWA = "lightning.pytorch.callbacks.StochasticWeightAveraging"
LR_MONITOR = "lightning.pytorch.callbacks.LearningRateMonitor"

# (name, arguments): each a form from Lightning's CLI docs ("Trainer Callbacks and arguments with class type",
# "Multiple optimizers and schedulers" with auto_configure_optimizers=False, "Run from Python")
FORMS = {
    "append-then-arguments": ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "val/accuracy",
                              "--trainer.callbacks.mode", "max"],
    "append-import-path": [f"--trainer.callbacks+={EARLY}", "--trainer.callbacks.monitor=val/accuracy",
                           "--trainer.callbacks.mode=max"],
    "append-swa": [f"--trainer.callbacks+={SWA}", "--trainer.callbacks.swa_lrs", "0.0001"],
    "append-two": ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.patience=5",
                   "--trainer.callbacks.monitor=val/accuracy", "--trainer.callbacks+=LearningRateMonitor",
                   "--trainer.callbacks.logging_interval=epoch"],
    "append-init-args": ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.init_args.monitor=val/accuracy",
                         "--trainer.callbacks.init_args.patience=2"],
    "append-a-dict": ["--trainer.callbacks+=" + json.dumps({"class_path": EARLY, "init_args": {
        "monitor": "val/accuracy", "mode": "max"}})],
    "list-of-dicts": ["--trainer.callbacks=" + json.dumps([
        {"class_path": EARLY, "init_args": {"monitor": "val/accuracy"}},
        {"class_path": LR_MONITOR, "init_args": {"logging_interval": "step"}}])],
    "one-dict": ["--trainer.callbacks", json.dumps({"class_path": SWA, "init_args": {"swa_lrs": 0.001}})],
    "one-by-name": ["--trainer.callbacks=EarlyStopping", "--trainer.callbacks.monitor=val/accuracy"],
    "class-path-and-init-args": ["--trainer.callbacks.class_path", "EarlyStopping",
                                 "--trainer.callbacks.init_args.monitor", "val/accuracy"],
    "optimizer-by-name": ["--model.optimizer", "Adam", "--model.optimizer.lr", "0.01"],
    "optimizer-class-path": ["--model.optimizer.class_path", "torch.optim.SGD", "--model.optimizer.init_args.lr",
                             "0.1"],
    "optimizer-import-path": ["--model.optimizer=torch.optim.SGD", "--model.optimizer.lr=0.1",
                              "--model.optimizer.momentum=0.9"],
    "optimizer-dict": ["--model.optimizer", json.dumps({"class_path": "torch.optim.SGD", "init_args": {"lr": 0.1}})],
    "optimizer-init-args": ["--model.optimizer=AdamW", "--model.optimizer.init_args.lr=0.002"],
    "scheduler-import-path": ["--model.lr_scheduler", "torch.optim.lr_scheduler.StepLR",
                              "--model.lr_scheduler.step_size", "1"],
    "scheduler-by-name": ["--model.lr_scheduler=CosineAnnealingLR", "--model.lr_scheduler.T_max=10"],
    "scheduler-dict": ["--model.lr_scheduler=" + json.dumps({"class_path": "torch.optim.lr_scheduler.ExponentialLR",
                                                            "init_args": {"gamma": 0.5}})],
    "plateau": ["--model.lr_scheduler=lightning.pytorch.cli.ReduceLROnPlateau",
                "--model.lr_scheduler.monitor=rollout/reward_mean", "--model.lr_scheduler.mode=max"],
    "everything-at-once": ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val/accuracy",
                           f"--trainer.callbacks+={SWA}", "--trainer.callbacks.swa_lrs=0.01",
                           "--model.optimizer=SGD", "--model.optimizer.lr=0.1",
                           "--model.lr_scheduler=StepLR", "--model.lr_scheduler.step_size=3"],
}


def plain_cli(args: list[str] | dict) -> LightningCLI:
    """Lightning's own CLI over the same classes, set up as lit-grpo's (its optimizer is the module's argument)."""
    return LightningCLI(PolicyModule, RolloutDataModule, run=False, args=args, auto_configure_optimizers=False,
                        trainer_defaults=TRAINER_DEFAULTS)


def simple_settings(obj: object) -> dict[str, object]:
    """An object's plain settings (numbers, strings, flags), what two equally configured callbacks share."""
    return {k: v for k, v in vars(obj).items() if isinstance(v, (str, int, float, bool, type(None)))}


def user_callbacks(trainer) -> list[tuple[str, dict[str, object]]]:
    kinds = (EARLY, SWA, LR_MONITOR)
    return [(f"{type(c).__module__.rsplit('.', 1)[0]}.{type(c).__name__}", simple_settings(c))
            for c in trainer.callbacks if any(type(c).__name__ == kind.rsplit(".", 1)[1] for kind in kinds)]


def optimizer_and_scheduler(module: PolicyModule) -> tuple[object, ...]:
    """What the module builds from its optimizer and scheduler arguments, on a stand-in parameter."""
    module.stand_in = torch.nn.Parameter(torch.zeros(2))  # no weights loaded: one trainable parameter stands in
    built = module.configure_optimizers()
    optimizer = built["optimizer"] if isinstance(built, dict) else built
    entry = built.get("lr_scheduler") if isinstance(built, dict) else None
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    scheduler = entry and {**entry, "scheduler": (type(entry["scheduler"]).__name__,
                                                  simple_settings(entry["scheduler"]))}
    return type(optimizer).__name__, groups, scheduler


@pytest.fixture
def common(tmp_path, tiny_llama_dir):
    return ["--model.model_name_or_path", str(tiny_llama_dir), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path)]


CALLBACKS_BUILT = {"append-two": 2, "list-of-dicts": 2, "everything-at-once": 2, "optimizer-by-name": 0,
                   "optimizer-class-path": 0,
                   "optimizer-import-path": 0, "optimizer-dict": 0, "optimizer-init-args": 0,
                   "scheduler-import-path": 0, "scheduler-by-name": 0, "scheduler-dict": 0, "plateau": 0}  # else 1


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_each_documented_form_builds_what_a_plain_lightning_cli_builds(form, common, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [*common, *FORMS[form]]
    ours, theirs = LitGRPOCLI(args=args, run=False), plain_cli(args)
    assert user_callbacks(ours.trainer) == user_callbacks(theirs.trainer)
    assert optimizer_and_scheduler(ours.model) == optimizer_and_scheduler(theirs.model)
    assert len(user_callbacks(ours.trainer)) == CALLBACKS_BUILT.get(form, 1)  # it reached the trainer


def test_the_forms_take_effect(common, tmp_path, monkeypatch):
    # not merely equal to the plain CLI's: the settings each form names are the ones the objects hold
    monkeypatch.chdir(tmp_path)
    cli = LitGRPOCLI(args=[*common, *FORMS["everything-at-once"]], run=False)
    early, swa = (c for c in cli.trainer.callbacks if type(c).__name__ in ("EarlyStopping", "StochasticWeightAveraging"))
    assert (early.monitor, early.mode, swa._swa_lrs) == ("val/accuracy", "min", 0.01)
    name, groups, scheduler = optimizer_and_scheduler(cli.model)
    assert (name, groups[0]["lr"], scheduler["scheduler"][0], scheduler["scheduler"][1]["step_size"]) == (
        "SGD", 0.1, "StepLR", 3)
    plateau = optimizer_and_scheduler(LitGRPOCLI(args=[*common, *FORMS["plateau"]], run=False).model)[2]
    assert (plateau["interval"], plateau["monitor"]) == ("epoch", "rollout/reward_mean")  # as Lightning's CLI does


def test_a_config_files_callbacks_and_an_appended_one(common, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(f"trainer:\n  callbacks:\n    - class_path: {LR_MONITOR}\n      init_args:\n"
                      "        logging_interval: epoch\n")
    args = [*common, "--config", str(config), "--trainer.callbacks+=EarlyStopping",
            "--trainer.callbacks.monitor=val/accuracy"]
    ours = user_callbacks(LitGRPOCLI(args=args, run=False).trainer)
    assert [name for name, _ in ours] == [LR_MONITOR, EARLY]
    assert ours == user_callbacks(plain_cli(args).trainer)


def test_a_dict_from_python_is_checked_and_built(tiny_llama_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = {"model": {"model_name_or_path": str(tiny_llama_dir)},
            "trainer": {"logger": False, "callbacks": [{"class_path": EARLY, "init_args": {"monitor": "val/accuracy"}}]}}
    assert [name for name, _ in user_callbacks(LitGRPOCLI(args=args, run=False).trainer)] == [EARLY]
    with pytest.raises(SystemExit) as stop:  # the check now sees a dict too: a rule between knobs, before any work
        LitGRPOCLI(args={**args, "data": {"group_size": 1}}, run=False)
    assert stop.value.code == 2
    assert "data.group_size 1 with model.advantage_mode 'grpo'" in capsys.readouterr().err


@pytest.mark.parametrize("flag, name, option", [
    ("--trainer.callbacks.help", "EarlyStopping", "--trainer.callbacks.monitor MONITOR"),
    ("--model.optimizer.help", "Adam", "[--model.optimizer.lr LR]"),
    ("--model.lr_scheduler.help", "StepLR", "--model.lr_scheduler.step_size STEP_SIZE")])
def test_help_for_a_class(flag, name, option, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", flag, name])
    assert stop.value.code == 0
    assert option in capsys.readouterr().out


@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_the_other_subcommands_parse_a_shipped_config(subcommand, tmp_path, monkeypatch):
    # each subcommand has arguments of its own (verbose, return_predictions) beside the classes' sections
    from lit_grpo.cli import subcommand_section

    monkeypatch.chdir(tmp_path)
    seen = {}

    class ParseOnly(LitGRPOCLI):
        def before_instantiate_classes(self) -> None:
            seen.update(subcommand_section(self.config).as_dict())
            raise SystemExit(0)

    with pytest.raises(SystemExit) as stop:
        ParseOnly(args=[subcommand, "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.logger", "false"])
    assert stop.value.code == 0 and seen["model"]["model_name_or_path"] == "data/tiny-llama"


def test_jsonargparse_refusal_with_nothing_else_found_is_its_own_message(capsys):
    # what the check cannot see (an argument of the default task, whose class the input does not name):
    # jsonargparse's words, with the subcommand's usage
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--data.task.nonsense", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("usage: ") and " fit " in err.splitlines()[0], err
    assert "Option 'nonsense' is not accepted" in err and "Traceback" not in err


def test_a_value_that_is_not_yaml_is_text_to_the_check_as_to_jsonargparse(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--model.kl.coef", "[1", "--data.group_size", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "the configuration has 2 problem(s)" in err and "Traceback" not in err, err


def test_a_config_given_as_text_is_read_as_jsonargparse_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = LitGRPOCLI(args=["--config", '{"trainer": {"max_epochs": 3, "logger": false}}'], run=False)
    assert cli.trainer.max_epochs == 3


def test_a_refused_input_still_lists_every_problem(common, capsys):
    # jsonargparse stops at its first problem; the check lists them all, the appended callbacks' among them
    args = ["fit", *common, "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.mdoe=max",
            "--trainer.callbacks+=StochasticWeightAveraging", "--model.kl.coef", "abc", "--data.group_size", "1",
            "--model.lr_scheduler=StepLR", "--model.lr_scheduler.step_sise=1"]
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    for fragment in ("the configuration has 5 problem(s)",
                     "trainer.callbacks[0].monitor: required, not given",
                     "trainer.callbacks[1].swa_lrs: required, not given",
                     "model.kl.coef: Expected a <class 'float'>. Got value: abc",
                     "data.group_size 1 with model.advantage_mode 'grpo'",
                     "model.lr_scheduler.step_sise: unknown key; did you mean step_size?"):
        assert fragment in err, err
    assert "Traceback" not in err


def test_lightnings_top_level_optimizer_sections_point_to_the_modules(common, capsys):
    # a plain LightningCLI with auto_configure_optimizers=False (Lightning's dependency-injection form) has no
    # --optimizer either; here the refusal says where it went
    with pytest.raises(SystemExit) as stop:
        main(["fit", *common, "--optimizer", "AdamW", "--optimizer.lr", "0.001", "--lr_scheduler", "StepLR"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "optimizer: the optimizer is the module's argument here: --model.optimizer AdamW" in err
    assert "lr_scheduler: the scheduler is the module's argument here: --model.lr_scheduler StepLR" in err


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    [f"--trainer.callbacks+={EARLY}", "--trainer.callbacks.monitor", "val/accuracy", "--trainer.callbacks.mode", "max"],
    [f"--trainer.callbacks+={SWA}", "--trainer.callbacks.swa_lrs", "0.0001"],
    ["--model.lr_scheduler", "torch.optim.lr_scheduler.StepLR", "--model.lr_scheduler.step_size", "1"],
], ids=["early-stopping", "swa", "step-lr"])
def test_the_issues_three_commands_train(extra, tmp_path):
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", str(ROOT / "configs/quickstart.yaml"),
               "--trainer.max_epochs", "2", "--trainer.check_val_every_n_epoch", "1",
               "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false", *extra]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(tmp_path.glob("quickstart/version_0/adapter/adapter_model.safetensors"))


def checkpoint_section(**given: object):
    from jsonargparse import Namespace

    from lit_grpo.cli import CHECKPOINT_DEFAULTS

    defaults = {key.removeprefix("checkpoint."): value for key, value in CHECKPOINT_DEFAULTS.items()}
    return Namespace(**{"monitor": None, "save_last": None, **defaults, **given})


def test_more_than_one_checkpoint_asked_for_gets_lightnings_names():
    from lit_grpo.cli import settle_checkpoint_files

    every = checkpoint_section(save_top_k=-1)
    assert "every epoch's checkpoint" in settle_checkpoint_files(every)
    assert (every.filename, every.save_last) == (None, "link")
    best = checkpoint_section(save_top_k=3, monitor="val/accuracy")
    assert "the best 3 checkpoint(s) by val/accuracy" in settle_checkpoint_files(best)
    assert (best.filename, best.save_last) == (None, True)  # a link would name the best, not the newest
    every_monitored = checkpoint_section(save_top_k=-1, monitor="val/accuracy")
    assert "every epoch's checkpoint" in settle_checkpoint_files(every_monitored)
    assert every_monitored.save_last is True  # saved only where the metric is logged: a link could lag
    for unchanged in (checkpoint_section(), checkpoint_section(save_top_k=0),
                      checkpoint_section(save_top_k=0, monitor="val/accuracy"),
                      checkpoint_section(save_top_k=-1, filename="{epoch}")):
        before = dict(vars(unchanged))
        assert settle_checkpoint_files(unchanged) is None and vars(unchanged) == before


@pytest.mark.slow
def test_save_top_k_minus_one_keeps_every_epoch_and_resumes_from_last(tmp_path, capsys):
    common = ["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--checkpoint.save_top_k", "-1",
              "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    main([*common, "--trainer.max_epochs", "3"])
    assert "keeping every epoch's checkpoint" in capsys.readouterr().err
    folder = tmp_path / "quickstart/version_0/checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "epoch=2-step=12.ckpt", "last.ckpt"]
    assert (folder / "last.ckpt").resolve() == (folder / "epoch=2-step=12.ckpt").resolve()  # a link, not a copy
    main([*common, "--trainer.max_epochs", "4", "--ckpt_path", "last"])
    assert (tmp_path / "quickstart/version_1/checkpoints/epoch=3-step=16.ckpt").is_file()  # went on from epoch 3


@pytest.mark.slow
def test_lightnings_own_refusal_while_running_is_one_line(tmp_path, capsys):
    # LearningRateMonitor refuses a trainer without a logger when fit starts, after the configuration was read
    with pytest.raises(SystemExit) as stop:
        main(["fit", "--config", str(ROOT / "configs/quickstart.yaml"), "--trainer.logger", "false",
              "--trainer.default_root_dir", str(tmp_path), "--trainer.callbacks+=LearningRateMonitor"])
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert ("lit-grpo: Lightning refused the configuration: Cannot use `LearningRateMonitor` callback with `Trainer` "
            "that has no logger.") in err
    assert "Traceback" not in err


def test_a_last_link_to_a_write_cut_short_resumes_from_the_newest_whole_file(tmp_path):
    # save_last "link": killed while the newest epoch's file was still being written in the background
    from types import SimpleNamespace

    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_grpo.run.resume import find_last_checkpoint

    folder = tmp_path / "runs/quickstart/version_0/checkpoints"
    folder.mkdir(parents=True)
    (folder / "epoch=0-step=4.ckpt").write_bytes(b"0")
    (folder / "epoch=1-step=8.ckpt").write_bytes(b"1")
    (folder / "last.ckpt").symlink_to("epoch=2-step=12.ckpt")  # never written
    logger = SimpleNamespace(save_dir=str(tmp_path / "runs"), name="quickstart")
    trainer = SimpleNamespace(callbacks=[ModelCheckpoint()], loggers=[logger])
    assert find_last_checkpoint(trainer) == str(folder / "epoch=1-step=8.ckpt")
    (folder / "epoch=2-step=12.ckpt").write_bytes(b"2")
    assert find_last_checkpoint(trainer) == str(folder / "last.ckpt")
