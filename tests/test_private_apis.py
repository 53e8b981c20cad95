"""The inventory of private third-party behaviour lit-grpo relies on, each pinned by a test that fails when an upgrade
of Lightning, jsonargparse, torch, transformers or Python changes it (issue 40, item 3).

Pinned in this file:
- ``LightningCLI._parse_ckpt_path`` (cli/command.py overrides it with a no-op): Lightning parses a checkpoint's
  ``hyper_parameters`` over the run's configuration, after our config check and above the command line; a checkpoint
  is data, so the command turns that off. No public hook sits between parsing and instantiation that could stop it.
- ``LightningCLI`` calls ``before_<subcommand>`` before it takes the subcommand's arguments from ``config_init``:
  cli/command.py settles ``weights_only`` and ``ckpt_path`` there (both hooks are public; their order is not
  documented).
- Lightning's launchers share the cores through ``lightning.fabric.utilities.distributed._set_num_threads_if_needed``,
  which leaves a set ``OMP_NUM_THREADS`` alone: run/distributed.py ``share_cores`` sets it first, counting every
  node on the machine.
- ``LightningModule._trainer`` (rollout/datamodule.py ``sync_policy``: is a trainer attached? the public ``trainer``
  property raises when none is).
- transformers' ``PretrainedConfig._attn_implementation`` (policy/packed.py ``packing_problem``: which attention
  kernel the model runs; when it is missing the packed forward is turned off, so a rename would only cost speed).

Pinned elsewhere, where the code they guard is tested:
- ``trainer._accelerator_connector.use_distributed_sampler`` (rollout/datamodule.py's setup refusal): tests/
  test_python_api.py ``test_the_private_lightning_attribute_that_setup_reads_still_holds_the_setting``.
- loggers' ``_version`` and ``_get_next_version()`` (run/run_dir.py ``claim_version``): tests/test_run_dir.py
  ``test_the_private_logger_members_claim_version_relies_on_are_still_there``.
- Lightning's signal connector composing its SIGTERM handler with the one StopOnSigterm installs in setup (run/
  signals.py never touches ``trainer._signal_connector``): tests/test_sigterm.py
  ``test_lightning_composes_its_sigterm_handler_with_the_one_installed_in_setup``.

Not private, listed so that nobody looks again: ``BaseException.add_note``/``__notes__`` (cli/command.py, PEP 678);
``rank_zero_only.rank`` (Lightning's documented rank attribute). engines/cpu_weights.py calls torch's
``torch.ops.mkldnn._reorder_linear_weight`` and ``_linear_pointwise``: it probes them first and falls back to the plain linear when they are missing or fail
(tests/test_cpu_features.py, tests/test_engine_hf.py), so an upgrade that drops them costs speed only.
"""

from __future__ import annotations

import inspect
import os

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from lit_grpo.cli import LitGRPOCLI


class Stop(Exception):
    """Ends a CLI's construction once the step under test has run."""


def test_lightning_cli_still_parses_the_checkpoints_hyper_parameters_in_parse_ckpt_path(tiny_llama_dir, tmp_path):
    # cli/command.py's no-op override stops this; should Lightning rename the method, move the merge elsewhere or
    # drop it, this test fails and the override must follow (or go)
    assert list(inspect.signature(LightningCLI._parse_ckpt_path).parameters) == ["self"]
    checkpoint = tmp_path / "other.ckpt"
    torch.save({"hyper_parameters": {"lora": {"rank": 3}}}, checkpoint)
    events: list[str] = []
    built: list[LitGRPOCLI] = []

    class Recording(LitGRPOCLI):
        def parse_arguments(self, parser, args):  # type: ignore[no-untyped-def]
            super().parse_arguments(parser, args)
            events.append("parse_arguments")

        def _parse_ckpt_path(self) -> None:
            events.append("_parse_ckpt_path")
            built.append(self)

        def before_instantiate_classes(self) -> None:
            events.append("before_instantiate_classes")
            raise Stop

    with pytest.raises(Stop):
        Recording(args=["fit", "--model.model_name_or_path", str(tiny_llama_dir), "--model.lora.rank", "5",
                        "--ckpt_path", str(checkpoint)])
    assert events == ["parse_arguments", "_parse_ckpt_path", "before_instantiate_classes"]
    (cli,) = built
    assert cli.config.fit.model.lora.rank == 5  # our override left the command line's value
    LightningCLI._parse_ckpt_path(cli)  # what Lightning itself would do at that point
    assert cli.config.fit.model.lora.rank == 3  # the checkpoint's value over the command line's


@pytest.mark.slow
def test_lightning_cli_takes_the_subcommands_arguments_after_before_fit(tiny_llama_dir, tmp_path):
    # cli/command.py's before_fit writes weights_only (and a resolved ckpt_path) into config_init; Lightning must
    # read the arguments it passes to Trainer.fit from there, after that hook
    received: list[dict] = []

    class Recording(LitGRPOCLI):
        def after_instantiate_classes(self) -> None:  # the parser has read Trainer.fit's own signature by now
            self.trainer.fit = lambda **kwargs: received.append(kwargs)  # type: ignore[method-assign]

    Recording(args=["fit", "--model.model_name_or_path", str(tiny_llama_dir),
                    "--trainer.default_root_dir", str(tmp_path)])
    (kwargs,) = received
    assert kwargs["weights_only"] is True  # the parser's default is None: before_fit's value arrived
    assert kwargs["ckpt_path"] is None


def test_lightnings_launchers_leave_a_set_omp_num_threads_alone(monkeypatch):
    # share_cores sets OMP_NUM_THREADS and torch's threads before Lightning's launcher, whose own call must keep them
    from lightning.fabric.utilities import distributed
    from lightning.pytorch.strategies.launchers import multiprocessing, subprocess_script

    assert subprocess_script._set_num_threads_if_needed is distributed._set_num_threads_if_needed
    assert multiprocessing._set_num_threads_if_needed is distributed._set_num_threads_if_needed
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        torch.set_num_threads(1)
        distributed._set_num_threads_if_needed(num_processes=1)  # unset, it would give this process every core
        assert (torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]) == (1, "1")
    finally:
        torch.set_num_threads(threads)


def test_a_lightning_module_tells_whether_a_trainer_is_attached_through_trainer():
    module = pl.LightningModule()
    assert module._trainer is None
    with pytest.raises(RuntimeError):  # why the public property cannot answer the question
        module.trainer  # noqa: B018
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    module.trainer = trainer
    assert module._trainer is trainer


@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_transformers_names_the_attention_kernel_in_attn_implementation(tiny_llama_dir, kernel):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, attn_implementation=kernel)
    assert model.config._attn_implementation == kernel
