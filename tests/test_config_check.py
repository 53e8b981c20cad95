"""The one-pass config check: every problem of a merged config in one list, before any class is built (design §2,
style practice 6); and how --config files and dotted overrides merge."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lit_grpo.cli.command_line import merged_config, split_options
from lit_grpo.cli.config_check import config_problems


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "llama"}')  # all the check reads: config.json, tokenizer
    (path / "tokenizer.json").write_text("{}")
    return str(path)


def assert_fragments(problems, fragments):
    missing = [f for f in fragments if not any(f in p for p in problems)]
    assert not missing, f"not reported: {missing}\nreported: {problems}"


def test_every_problem_reported_at_once():
    config = {
        "model": {
            "loss_variant": "ppo2",  # unknown variant
            "model_name_or_path": "/nonexistent/model",  # missing path
            "kl": {"coef": "lots"},  # bad type
            "lora_rnak": 4,  # unknown key
        },
        "data": {"group_size": 1, "task": {"class_path": "no.such.module.Task"}},  # G = 1 with grpo; no import
        "trainer": {"reload_dataloaders_every_n_epochs": 0, "max_epochs": 2},
        "extra": 1,  # unknown top-level key
    }
    problems = config_problems(config)
    expected = [
        "extra: unknown top-level key",
        "model.loss_variant",
        "ppo2",
        "model.kl.coef",
        "lots",
        "model.lora_rnak: unknown key; did you mean lora_rank?",
        "data.task: cannot import class_path 'no.such.module.Task'",
        "model.model_name_or_path: '/nonexistent/model' is not a model directory",
        "data.group_size 1 with model.advantage_mode 'grpo'",
        "trainer.reload_dataloaders_every_n_epochs: must be 1",
    ]
    assert_fragments(problems, expected)
    assert len(problems) == 8, problems  # each mistake exactly once (a bad value is not re-reported by value checks)


def test_more_problems_at_once(model_dir):
    config = {
        "model": {
            "model_name_or_path": model_dir,
            "loss_variant": "gspo",
            "aggregation": "token-mean",  # gspo takes seq-mean only
            "kl": {"coef": -1.0},
        },
        "data": {
            "group_size": 3,
            "minibatch_size": 8,  # not a multiple of 3
            "temperature": 0.0,
            "task": {"class_path": "lit_grpo.tasks.SortTask", "init_args": {"max_len": "five", "bogus": 1}},
        },
        "trainer": {"max_epochs": "many", "no_such_flag": True},
    }
    problems = config_problems(config)
    expected = [
        "data.minibatch_size: 8 is not a multiple of group_size (3)",
        "data.temperature: must be > 0",
        "model.aggregation: loss_variant 'gspo' takes 'seq-mean' only",
        "model.kl.coef: must be >= 0, got -1.0",
        "data.task.max_len",
        "data.task.bogus",
        "trainer.max_epochs",
        "trainer.no_such_flag",
    ]
    assert_fragments(problems, expected)
    assert len(problems) == 8, problems


def test_task_class_path_must_be_a_task(model_dir):
    config = {"model": {"model_name_or_path": model_dir}, "data": {"task": {"class_path": "collections.OrderedDict"}}}
    assert config_problems(config) == [
        "data.task: 'collections.OrderedDict' is not a subclass of lit_grpo.tasks.base.Task"
    ]


def test_group_size_one_is_fine_with_raw_advantages(model_dir):
    config = {
        "model": {"model_name_or_path": model_dir, "advantage_mode": "raw"},
        "data": {"group_size": 1, "minibatch_size": 5},
    }
    assert config_problems(config) == []


def test_valid_config_has_no_problems(model_dir):
    config = {
        "seed_everything": 0,
        "model": {"model_name_or_path": model_dir, "lora": {"rank": 8}, "kl": {"coef": 0.0}, "aggregation": "constant"},
        "data": {
            "group_size": 4,
            "minibatch_size": 8,
            "prompts_per_epoch": 4,
            "task": {"class_path": "lit_grpo.tasks.SortTask", "init_args": {"max_len": 4}},
        },
        "trainer": {"max_epochs": 2, "reload_dataloaders_every_n_epochs": 1, "accelerator": "cpu"},
    }
    assert config_problems(config) == []
    assert config_problems({}) == []  # the defaults are valid


# --- merging --config files and overrides ------------------------------------------------------------------------
def test_merged_config_two_files_and_dotted_overrides(tmp_path):
    first = tmp_path / "a.yaml"
    first.write_text(
        yaml.safe_dump(
            {
                "model": {"kl": {"coef": 0.04}, "lora": {"rank": 8}},
                "data": {
                    "group_size": 8,
                    "task": {"class_path": "lit_grpo.tasks.SortTask", "init_args": {"max_len": 4}},
                },
            }
        )
    )
    second = tmp_path / "b.yaml"
    second.write_text(yaml.safe_dump({"model": {"kl": {"coef": 0.02}}, "data": {"task": {"init_args": {"min_len": 2}}}}))
    args = ["fit", "--config", str(first), f"--config={second}", "--model.kl.coef=0.1", "--data.group_size", "4"]
    args += ["--trainer.fast_dev_run"]
    assert merged_config(args) == {
        "model": {"kl": {"coef": 0.1}, "lora": {"rank": 8}},  # b's 0.02 over a's 0.04, then the override over both
        "data": {
            "group_size": 4,  # parsed as an int
            "task": {"class_path": "lit_grpo.tasks.SortTask", "init_args": {"max_len": 4, "min_len": 2}},  # deep merge
        },
        "trainer": {"fast_dev_run": True},  # a bare flag
    }


def test_merged_config_applies_arguments_in_order(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("model:\n  kl:\n    coef: 0.5\n")
    # as in jsonargparse, a later --config overrides an earlier dotted value
    assert merged_config(["fit", "--model.kl.coef=0.1", "--config", str(path)]) == {"model": {"kl": {"coef": 0.5}}}
    assert merged_config(["fit", "--config", str(path), "--model.kl.coef", "-0.25"]) == {
        "model": {"kl": {"coef": -0.25}}}


@pytest.mark.parametrize(
    "args", [[], ["--help"], ["fit", "--help"], ["fit", "-h"], ["fit", "--print_config"], ["other"]]
)
def test_merged_config_none_for_help_and_unknown_subcommands(args):
    assert merged_config(args) is None


def test_merged_config_reads_appends_and_class_arguments_as_jsonargparse_does(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("trainer:\n  callbacks:\n    - class_path: LearningRateMonitor\n")
    args = ["fit", "--config", str(path), "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "m",
            "--trainer.callbacks+", '{"class_path": "StochasticWeightAveraging", "init_args": {"swa_lrs": 0.1}}',
            "--trainer.callbacks.init_args.swa_epoch_start", "2", "--model.optimizer", "SGD",
            "--model.optimizer.lr", "0.5", "--model.lr_scheduler.init_args.gamma", "0.9"]
    assert merged_config(args) == {
        "trainer": {"callbacks": [  # the file's, then each append with the arguments that followed it
            {"class_path": "LearningRateMonitor"},
            {"class_path": "EarlyStopping", "init_args": {"monitor": "m"}},
            {"class_path": "StochasticWeightAveraging", "init_args": {"swa_lrs": 0.1, "swa_epoch_start": 2}}]},
        "model": {"optimizer": {"class_path": "SGD", "init_args": {"lr": 0.5}},
                  "lr_scheduler": {"init_args": {"gamma": 0.9}}},
    }
    listed = ["fit", "--trainer.callbacks+=[EarlyStopping, LearningRateMonitor]", "--trainer.callbacks.mode=max"]
    assert merged_config(listed)["trainer"]["callbacks"] == [  # a list extends; the arguments go to its last
        "EarlyStopping", {"class_path": "LearningRateMonitor", "init_args": {"mode": "max"}}]


def test_split_options():
    pairs = split_options(["--a=1", "--b", "2", "--flag", "--c", "-3"])
    assert pairs == [("a", "1"), ("b", "2"), ("flag", None), ("c", "-3")]


def test_short_config_flag(tmp_path):
    # LightningCLI accepts -c as well as --config; the pre-check must read the file, not report a key ''
    path = tmp_path / "a.yaml"
    path.write_text("model:\n  kl: {coef: 0.5}\n")
    assert merged_config(["fit", "-c", str(path)]) == {"model": {"kl": {"coef": 0.5}}}


def test_scientific_notation_floats(tmp_path, model_dir):
    # `1e-3` is a float to jsonargparse (its YAML loader fixes PyYAML's YAML 1.1 float rule) and so must be to
    # the pre-check, in files and on the command line; as a string it crashes the value checks (str < int)
    path = tmp_path / "a.yaml"
    path.write_text(f"model:\n  kl:\n    coef: 1e-3\n  model_name_or_path: {model_dir}\n")
    merged = merged_config(["fit", "--config", str(path), "--model.clip.eps=2e-4"])
    assert merged["model"]["kl"]["coef"] == 0.001 and isinstance(merged["model"]["kl"]["coef"], float)
    assert merged["model"]["clip"]["eps"] == 0.0002 and isinstance(merged["model"]["clip"]["eps"], float)
    assert config_problems(merged) == []


def test_override_inside_a_class_given_by_name(model_dir):
    # jsonargparse accepts `--data.task X --data.task.init_args.max_len 4`: the pre-check must not crash on it
    args = ["fit", "--model.model_name_or_path", model_dir, "--data.task", "lit_grpo.tasks.SortTask"]
    args += ["--data.task.init_args.max_len", "4"]
    try:
        merged = merged_config(args)
    except Exception as error:  # noqa: BLE001 - a crash here is the bug this test pins
        pytest.fail(f"merged_config crashed on an override below a class given by name: {error!r}")
    assert config_problems(merged) == []


# --- the command ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_reports_all_problems_in_one_message_and_exits_2(tmp_path):
    script = Path(sys.executable).parent / "lit-grpo"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "lit_grpo.cli"]
    args = ["fit", "--model.loss_variant", "ppo2", "--data.group_size", "1"]
    args += ["--model.model_name_or_path", "/nonexistent"]
    result = subprocess.run(command + args, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "lit-grpo: the configuration has 3 problem(s):" in result.stderr
    assert_fragments(
        result.stderr.splitlines(),
        [
            "  - model.loss_variant",
            "  - model.model_name_or_path: '/nonexistent'",
            "  - data.group_size 1 with model.advantage_mode 'grpo'",
        ],
    )
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "lightning_logs").exists()  # nothing ran


def test_a_task_with_a_required_argument_takes_its_other_arguments(model_dir):
    # JsonlTask's path is required: each other argument is checked beside it (it used to be refused alone with
    # "required: path", which blocked every custom reward), a bad one is still named, a missing path is named once
    task = {"class_path": "lit_grpo.tasks.JsonlTask",
            "init_args": {"path": "p.jsonl", "reward": {"class_path": "lit_grpo.tasks.ExactMatchReward"},
                          "split_seed": 3}}
    config = {"model": {"model_name_or_path": model_dir}, "data": {"task": task}}
    assert config_problems(config) == []
    task["init_args"]["heldout_fraction"] = "lots"
    (problem,) = config_problems(config)
    assert problem.startswith("data.task.heldout_fraction:") and "lots" in problem
    del task["init_args"]["path"]
    assert config_problems(config) == ["data.task.path: required, not given"]


def test_weights_only_false_is_refused_and_null_accepted():
    assert config_problems({"weights_only": None}) == []
    (problem,) = config_problems({"weights_only": False})
    assert problem.startswith("weights_only: false would unpickle the checkpoint")


def test_cross_knob_rules_run_alike_from_the_command_line_and_the_python_api(model_dir):
    # issue 33, item 3: one registry (lit_grpo.run.rules) checks the command line before any weights load and the
    # Python API in RolloutDataModule.setup; the group-of-one rule ran from the command line only
    import lightning.pytorch as pl

    from lit_grpo.errors import InputError
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule

    config = {"model": {"model_name_or_path": str(model_dir)}, "data": {"group_size": 1, "minibatch_size": 8}}
    group_of_one = ("data.group_size 1 with model.advantage_mode 'grpo': a group of one has advantage 0, so nothing "
                    "would be learned; use group_size >= 2 (or advantage_mode 'raw')")
    assert config_problems(config) == [group_of_one]
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(InputError) as raised:
        trainer.fit(PolicyModule(model_name_or_path=str(model_dir)), RolloutDataModule(group_size=1, minibatch_size=8))
    assert str(raised.value).endswith(group_of_one)
    # tree rollouts of a single-round task: one message, both ways (it was a ValueError naming no knob)
    tree_task = ("data.rollout 'tree' needs a multi-round task (a MultiRoundTask subclass), got data.task "
                 "ArithmeticTask; use data.rollout 'grouped' or a MultiRoundTask")
    assert config_problems({"model": {"model_name_or_path": str(model_dir)}, "data": {"rollout": "tree"}}) == [tree_task]
    with pytest.raises(InputError) as raised:
        RolloutDataModule(rollout="tree")
    assert str(raised.value).endswith(tree_task)


def test_the_python_api_refuses_a_trainer_that_reuses_the_first_rollouts_before_any_weights_load(model_dir,
                                                                                                  monkeypatch):
    import lightning.pytorch as pl
    from support import weight_reads

    from lit_grpo.errors import InputError
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule

    reads = weight_reads(monkeypatch)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(InputError, match=r"needs Trainer\(reload_dataloaders_every_n_epochs=1\)"):
        trainer.fit(PolicyModule(model_name_or_path=str(model_dir)), RolloutDataModule())
    assert reads == []  # refused in setup, before configure_model reads any weights


# issue 40, item 5: a rule between knobs lives once (lit_grpo.run.rules), worded once, heard both ways
RELOAD = ("trainer.reload_dataloaders_every_n_epochs: must be 1, got 0: RolloutDataModule needs "
          "Trainer(reload_dataloaders_every_n_epochs=1), else the first epoch's rollouts would be trained on forever")
RISK_VALUE = ("RiskThreshold decision: value forces answers, but the task ArithmeticTask does not say which first "
              "tokens answer: give it an answer_token_ids(tokenizer) method, or use decision: threshold")


@pytest.mark.parametrize(("trainer_config", "trainer_arguments", "message"), [
    ({"reload_dataloaders_every_n_epochs": 0}, {"reload_dataloaders_every_n_epochs": 0}, RELOAD),
    ({"callbacks": [{"class_path": "lit_grpo.callbacks.RiskThreshold", "init_args": {"decision": "value"}}]},
     {"callbacks": "RiskThreshold(decision='value')"}, RISK_VALUE),
], ids=["reload", "risk-decision"])
def test_a_rule_between_knobs_says_the_same_from_the_command_and_from_python(model_dir, monkeypatch, trainer_config,
                                                                           trainer_arguments, message):
    import lightning.pytorch as pl
    from support import weight_reads

    from lit_grpo.callbacks import RiskThreshold
    from lit_grpo.errors import InputError
    from lit_grpo.policy.module import PolicyModule
    from lit_grpo.rollout.datamodule import RolloutDataModule

    assert config_problems({"model": {"model_name_or_path": model_dir}, "trainer": trainer_config}) == [message]
    reads = weight_reads(monkeypatch)
    arguments = dict(trainer_arguments)
    if "callbacks" in arguments:
        arguments["callbacks"] = [RiskThreshold(decision="value")]
    trainer = pl.Trainer(**{"reload_dataloaders_every_n_epochs": 1, **arguments}, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(InputError) as refused:
        trainer.fit(PolicyModule(model_name_or_path=str(model_dir)), RolloutDataModule())
    assert str(refused.value).endswith(f"\n  - {message}")
    assert reads == []  # in setup, before any weights load


def test_class_paths_import_as_jsonargparse_imports_them():
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_grpo.cli.config_check import import_object

    assert import_object("lightning.pytorch.callbacks.ModelCheckpoint") is ModelCheckpoint
    for path in ("ModelCheckpoint", "no.such.module.Task", "lightning.pytorch.callbacks.NoSuchCallback"):
        with pytest.raises((ValueError, ImportError, AttributeError)):
            import_object(path)


def test_keys_one_level_down_get_the_top_levels_check():
    engine = {"class_path": "HFEngine", "init_args": {"batchsize": 3}}  # a bare name, found in lit_grpo.engines
    assert config_problems({"data": {"engine": engine}}) == ["data.engine.batchsize: unknown key; did you mean batch_size?"]
    callbacks = [{"class_path": "ModelCheckpoint", "init_args": {"every_n_epoch": 1}},
                 {"class_path": "lit_grpo.callbacks.RolloutMetrics", "init_args": {"table_rows": 2}}]
    assert config_problems({"trainer": {"callbacks": callbacks}}) == [
        "trainer.callbacks[0].every_n_epoch: unknown key; did you mean every_n_epochs?"]
    strategy = {"class_path": "lightning.pytorch.strategies.DDPStrategy", "init_args": {"find_unused_parameter": True}}
    assert config_problems({"trainer": {"strategy": strategy}}) == [
        "trainer.strategy.find_unused_parameter: unknown key"]  # a **kwargs class: refused, nothing close to suggest
    appended = merged_config(["fit", "--trainer.strategy", "ddp", "--trainer.callbacks+=ModelCheckpoint"])
    assert appended == {"trainer": {"strategy": "ddp", "callbacks": ["ModelCheckpoint"]}}  # an alias, then an append
    assert config_problems(appended) == []
    assert config_problems({"model": {"init_args": {"kl": {"coef": 0.1}}}}) == [
        "model.init_args: model: takes PolicyModule's settings directly (model.kl.coef, not model.init_args.kl.coef)"]
    assert config_problems({"metrics": 5}) == ["metrics: expected a mapping of metrics.* settings, got 5"]
    logger = {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dr": "runs"}}
    assert config_problems({"trainer": {"logger": logger}}) == ["trainer.logger.save_dir: required, not given; is it save_dr?"]
