"""One run, however it starts (issue 40, item 2): ``PolicyModule`` and ``RolloutDataModule``, exported by
``lit_grpo``, declare what every run needs through Lightning's hooks (``configure_callbacks``; refusals in the data
module's ``setup``), so a plain ``lightning.Trainer`` trains what the ``lit-grpo`` command trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file
from support import DigitShareTask
from test_readme_examples import ROOT, python_example

from lit_grpo.callbacks import NonFiniteGuard, RngState
from lit_grpo.errors import InputError
from lit_grpo.policy.interrupt import SaveOnInterrupt
from lit_grpo.policy.learning_signal import LearningSignalWatch
from lit_grpo.policy.module import PolicyModule
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.signals import StopOnSigterm

QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}


class StricterGuard(NonFiniteGuard):
    """A user's own kind of guard: Lightning would keep it beside a plain ``NonFiniteGuard`` (not the same type)."""


def test_lit_grpo_exports_the_module_and_the_data_module():
    import lit_grpo
    from lit_grpo import PolicyModule as Exported, RolloutDataModule as ExportedData

    assert (Exported, ExportedData) == (PolicyModule, RolloutDataModule)
    assert {"PolicyModule", "RolloutDataModule"} <= set(dir(lit_grpo)) and "PolicyModule" in lit_grpo.__all__
    with pytest.raises(AttributeError, match="no attribute 'Policy'"):
        lit_grpo.Policy  # noqa: B018 - a misspelt name is an AttributeError, as for any module


def test_importing_lit_grpo_loads_neither_torch_nor_lightning():
    # the command's start and `lit_grpo.errors` stay cheap: the exports load on first use
    code = "import sys, lit_grpo; print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def declared(callbacks: list[pl.Callback]) -> list[pl.Callback]:
    """What ``PolicyModule.configure_callbacks`` returns on a trainer holding ``callbacks`` (no weights load)."""
    module = PolicyModule()
    module.trainer = pl.Trainer(callbacks=callbacks, **QUIET)
    return module.configure_callbacks()


def test_the_module_declares_what_every_run_needs_unless_the_trainer_holds_it():
    every = [NonFiniteGuard, RngState, StopOnSigterm, SaveOnInterrupt, LearningSignalWatch]
    assert [type(c) for c in declared([])] == every
    assert declared([])[0].max_consecutive_skips == 3  # the defaults
    assert [type(c) for c in declared([NonFiniteGuard(max_consecutive_skips=7)])] == every[1:]
    assert [type(c) for c in declared([StricterGuard(), RngState()])] == every[2:]  # a subclass counts as one


@pytest.mark.slow
def test_a_trainer_ends_with_one_guard_and_one_rng_state_keeping_a_users_own(tiny_llama_dir, tmp_path):
    # Lightning's merge (2.6.6 _attach_model_callbacks): a callback from configure_callbacks replaces the trainer's
    # of the same type; the module returns none of a kind the trainer holds, so a user's settings survive
    cases = (([], ["NonFiniteGuard", "RngState"], 3),
             ([NonFiniteGuard(max_consecutive_skips=7)], ["NonFiniteGuard", "RngState"], 7),
             ([StricterGuard(max_consecutive_skips=5), RngState()], ["StricterGuard", "RngState"], 5))
    for given, kinds, skips in cases:
        module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 2})
        data = RolloutDataModule(prompts_per_epoch=2, group_size=2, minibatch_size=4, max_new_tokens=2,
                                 val_max_prompts=2)
        trainer = pl.Trainer(max_epochs=0, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                             callbacks=given, enable_checkpointing=False, default_root_dir=tmp_path, **QUIET)
        trainer.fit(module, datamodule=data)  # no epoch: the callbacks are attached, the weights loaded
        guards = [c for c in trainer.callbacks if isinstance(c, (NonFiniteGuard, RngState))]
        assert [type(c).__name__ for c in guards] == kinds
        assert guards[0].max_consecutive_skips == skips


def test_the_command_gets_them_from_the_module_and_keeps_a_users_own(tiny_llama_dir, tmp_path):
    from lit_grpo.cli import LitGRPOCLI

    base = ["--model.model_name_or_path", str(tiny_llama_dir), "--trainer.default_root_dir", str(tmp_path)]
    every = [NonFiniteGuard, RngState, StopOnSigterm, SaveOnInterrupt, LearningSignalWatch]
    for extra, kinds in (([], every),
                         (["--trainer.callbacks+=lit_grpo.callbacks.NonFiniteGuard",  # the old name still works
                           "--trainer.callbacks.max_consecutive_skips=7"], every[1:])):
        cli = LitGRPOCLI(args=base + extra, run=False)
        assert not any(isinstance(c, (RngState, StopOnSigterm, SaveOnInterrupt)) for c in cli.trainer.callbacks)  # cli/ adds none
        cli.model.trainer = cli.trainer
        assert [type(c) for c in cli.model.configure_callbacks()] == kinds


# --- what the data module refuses in setup --------------------------------------------------------------------------
def ddp_trainer(use_distributed_sampler: bool) -> pl.Trainer:
    # two CPU processes' trainer, built but not launched: setup's checks see its world size and settings
    return pl.Trainer(accelerator="cpu", strategy="ddp", devices=2, use_distributed_sampler=use_distributed_sampler,
                      reload_dataloaders_every_n_epochs=1, **QUIET)


def set_up(trainer: pl.Trainer, stage: str = "fit") -> RolloutDataModule:
    data = RolloutDataModule(prompts_per_epoch=4, group_size=2, minibatch_size=4)
    trainer.strategy.connect(PolicyModule())  # trainer.lightning_module, as fit sets it
    data.trainer = trainer
    data.setup(stage)
    return data


def test_setup_refuses_the_distributed_sampler_under_ddp():
    with pytest.raises(InputError, match=r"trainer\.use_distributed_sampler: must be false"):
        set_up(ddp_trainer(use_distributed_sampler=True))  # Trainer's default: each rank would get half its share
    set_up(ddp_trainer(use_distributed_sampler=False))
    set_up(pl.Trainer(reload_dataloaders_every_n_epochs=1, **QUIET))  # one process: the sampler is not wrapped


def test_the_private_lightning_attribute_that_setup_reads_still_holds_the_setting():
    # Lightning 2.6.6 has no public reader of Trainer(use_distributed_sampler=...); RolloutDataModule.setup reads
    # trainer._accelerator_connector.use_distributed_sampler. This fails when an upgrade moves or renames it.
    for value in (True, False):
        assert ddp_trainer(value)._accelerator_connector.use_distributed_sampler is value


def test_a_python_resume_onto_another_task_is_refused_as_the_commands_is():
    from lit_grpo.tasks import ArithmeticTask, SortTask

    saved = RolloutDataModule().state_dict()  # the arithmetic task's cursor and record
    saved["cursor"] = 64
    with pytest.raises(InputError, match=r"counts the training prompts of .*ArithmeticTask.*this run's data\.task is "
                                         r".*SortTask"):
        RolloutDataModule(task=SortTask()).load_state_dict(saved)
    same = RolloutDataModule(task=ArithmeticTask())  # the default task is a lazy instance of the same class
    same.load_state_dict(saved)
    assert same.prompts.cursor == 64


def test_setup_refuses_a_trainer_that_does_not_reload_every_epoch():
    trainer = pl.Trainer(**QUIET)  # Lightning's default: 0, the first epoch's loader forever
    with pytest.raises(InputError, match=r"needs Trainer\(reload_dataloaders_every_n_epochs=1\)"):
        set_up(trainer)


@pytest.mark.slow
def test_validate_and_test_run_under_lightnings_default_reload(tiny_llama_dir, tmp_path):
    # neither trains an epoch, so the every-epoch reload that fit needs is not asked of them (issue 47)
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4})
    data = RolloutDataModule(task=DigitShareTask(), prompts_per_epoch=4, group_size=2, minibatch_size=4,
                             max_new_tokens=3, val_max_prompts=4, val_batch_size=4)
    trainer = pl.Trainer(default_root_dir=tmp_path, **QUIET)  # reload_dataloaders_every_n_epochs: Lightning's 0
    validated = trainer.validate(module, datamodule=data)
    tested = trainer.test(module, datamodule=data)
    assert 0.0 <= validated[0]["val/accuracy"] <= 1.0
    assert 0.0 <= tested[0]["test/accuracy"] <= 1.0
    with pytest.raises(InputError, match=r"needs Trainer\(reload_dataloaders_every_n_epochs=1\)"):
        trainer.fit(module, datamodule=data)  # fit still refuses it, on the same trainer


def fit_adapter(tiny_llama_dir: Path, root: Path, **trainer_args: object) -> dict[str, torch.Tensor]:
    pl.seed_everything(0)
    module = PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 4},
                          optimizer=lambda params: torch.optim.AdamW(params, lr=1e-2))
    data = RolloutDataModule(task=DigitShareTask(), prompts_per_epoch=4, group_size=4, minibatch_size=8,
                             max_new_tokens=4, val_max_prompts=8, val_batch_size=4)
    trainer = pl.Trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, enable_checkpointing=False,
                         default_root_dir=root, **QUIET, **trainer_args)
    trainer.fit(module, datamodule=data)
    return {name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_a_sanity_check_is_harmless(tiny_llama_dir, tmp_path, caplog):
    # Lightning's default runs 2 validation batches before training, inside isolate_rng, its logs dropped: the
    # adapter is the one trained without it; its line says what it was (not "after epoch 0")
    without = fit_adapter(tiny_llama_dir, tmp_path / "without", num_sanity_val_steps=0)
    caplog.clear()
    with caplog.at_level("INFO"):
        checked = fit_adapter(tiny_llama_dir, tmp_path / "with", num_sanity_val_steps=2)
    assert without.keys() == checked.keys()
    assert all(torch.equal(without[name], checked[name]) for name in without)
    assert max(float(t.abs().max()) for name, t in checked.items() if "lora_B" in name) > 0  # it trained
    lines = [r.getMessage() for r in caplog.records if "val/reward" in r.getMessage()]
    assert lines[0].startswith("sanity check (not logged): val/reward")
    assert lines[1].startswith("before training: val/reward")


class PlainData(pl.LightningDataModule):
    """A user's own Lightning data module: it serves a ``RolloutDataModule``'s loaders through Lightning's hooks and
    nothing more (no ``held_out_scores``)."""

    def __init__(self, inner: RolloutDataModule) -> None:
        super().__init__()
        self.inner = inner

    def setup(self, stage: str) -> None:
        self.inner.trainer = self.trainer
        self.inner.setup(stage)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return self.inner.train_dataloader()

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self.inner.val_dataloader()


def test_the_module_measures_outside_lightnings_loop_only_on_a_data_module_that_serves_held_out_scores(
        tiny_llama_dir, tmp_path, caplog):
    # the module reads no data module's loader by reaching for it: it takes the ServesHeldOutScores it declares, and
    # a data module without one (validation on) gets a warning that says what is skipped, not an AttributeError
    from lit_grpo.buffers.protocols import ServesHeldOutScores

    def data() -> RolloutDataModule:
        return RolloutDataModule(group_size=2, prompts_per_epoch=2, minibatch_size=4, val_max_prompts=4)

    assert isinstance(data(), ServesHeldOutScores) and not isinstance(PlainData(data()), ServesHeldOutScores)
    trainer = pl.Trainer(max_epochs=1, reload_dataloaders_every_n_epochs=1, num_sanity_val_steps=0,
                         enable_checkpointing=False, default_root_dir=tmp_path, **QUIET)
    with caplog.at_level("INFO"), pytest.warns(UserWarning, match=r"data module \(PlainData\) does not serve "
                                                                  r"held_out_scores\(\)"):
        trainer.fit(PolicyModule(model_name_or_path=str(tiny_llama_dir), lora={"rank": 2}, kl={"coef": 0.0}),
                    PlainData(data()))
    assert "before training: val/" not in caplog.text  # skipped, as the warning said
    assert "after epoch 0: val/reward" in caplog.text  # Lightning's own validation ran


# --- the "Done when" checks: a Python run trains the command's adapter ------------------------------------------------
def run_command(root: Path, *args: str) -> Path:
    """``lit-grpo fit`` on the quickstart into ``root``; returns its version directory."""
    command = [sys.executable, "-m", "lit_grpo.cli", "fit", "--config", "configs/quickstart.yaml",
               "--trainer.logger.init_args.save_dir", str(root), "--trainer.enable_progress_bar", "false", *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    (version,) = (root / "quickstart").glob("version_*")
    return version


def run_python(code: str) -> str:
    """Runs ``code`` from the checkout root; returns what it wrote to stderr (the run's log)."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def adapter_tensors(version: Path) -> dict[str, torch.Tensor]:
    return load_file(version / "adapter" / "adapter_model.safetensors")


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and len(a) > 0
    return max(float((a[name] - b[name]).abs().max()) for name in a)


@pytest.fixture(scope="module")
def command_four_epochs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    adapter = adapter_tensors(run_command(tmp_path_factory.mktemp("command"), "--trainer.max_epochs", "4"))
    # LoRA's B starts at zero: a trained adapter has moved it (two untrained adapters would agree as well)
    assert max(float(t.abs().max()) for name, t in adapter.items() if "lora_B" in name) > 0
    return adapter


@pytest.mark.slow
def test_the_readme_example_for_four_epochs_trains_the_commands_adapter(command_four_epochs, tmp_path):
    run_python(python_example(tmp_path, max_epochs=4))
    (version,) = (tmp_path / "quickstart").glob("version_*")
    difference = largest_difference(adapter_tensors(version), command_four_epochs)
    print(f"largest difference, Python against the command: {difference}")
    assert difference <= 1e-6


@pytest.mark.slow
def test_a_python_run_resumed_from_the_commands_checkpoint_trains_the_commands_adapter(command_four_epochs, tmp_path):
    version = run_command(tmp_path / "command", "--trainer.max_epochs", "2")
    last = version / "checkpoints" / "last.ckpt"
    log = run_python(python_example(tmp_path / "python", max_epochs=4, ckpt_path=last))
    # it did resume: a run from scratch trains the same adapter too (the test above)
    assert "epoch 0:" not in log and "epoch 2: 32 prompts" in log
    (resumed,) = (tmp_path / "python" / "quickstart").glob("version_*")
    assert largest_difference(adapter_tensors(resumed), command_four_epochs) <= 1e-6
