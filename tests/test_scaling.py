"""docs/scaling.md's launch commands, run as written (design §12): two "nodes" on loopback, started by Lightning's
launcher or by torchrun, train the adapter of one node with two devices, and of one process on the same rollouts;
each process takes its share of the
cores; FSDP and DeepSpeed on a CPU are one config message, not Lightning's traceback."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lit_grpo.cli.config_check import config_problems
from lit_grpo.run.distributed import processes_on_this_machine
from lit_grpo.engines.server_address import free_port

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "scaling.md"
DOC_PORT = "29500"  # the port the doc's commands use; each launch here gets a free one instead
BIN = Path(sys.executable).parent  # the venv's lit-grpo and torchrun
# 2 epochs of 4 prompts x 4 completions, one optimizer step per epoch on each of the 2 ranks; SGD, as in
# test_ddp.py: Adam divides each gradient element by its own running scale, so the last bits of a near-zero element
# (the order in which ranks' sums add up) become a full-size difference of the step (6.7e-6 against one process)
SHORT_RUN = ["--trainer.max_epochs", "2", "--data.prompts_per_epoch", "4", "--data.group_size", "4",
             "--data.minibatch_size", "8", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar",
             "false", "--metrics.table_every_n_epochs", "0", "--model.optimizer.class_path", "torch.optim.SGD",
             "--model.optimizer.init_args.lr", "0.5"]
# what a launcher or an outer test run could leave in the environment and change how the processes find each other
LAUNCH_ENV = ("OMP_NUM_THREADS", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "WORLD_SIZE",
              "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME")


def doc_block(first_line: str) -> str:
    """The ```bash block of docs/scaling.md whose first line is ``first_line`` (as test_readme_examples reads the
    README's)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if b.startswith(first_line)]
    return block


def doc_commands(first_line: str, port: int) -> list[tuple[dict[str, str], list[str]]]:
    """Each command of a block as ``(environment assignments, argv)``: continuation lines joined, comments
    dropped, the doc's port replaced by ``port``, ``lit-grpo`` and ``torchrun`` taken from this venv."""
    text = doc_block(first_line).replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = [word.replace(DOC_PORT, str(port)) for word in shlex.split(line)]
        env = {}
        while "=" in words[0] and not words[0].startswith("-"):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if words[0] in ("lit-grpo", "torchrun"):
            words[0] = str(BIN / words[0])
        commands.append((env, words))
    return commands


def launch(first_line: str, save_dir: Path) -> list[str]:
    """Runs a block's commands at once (the nodes of one launch), shortened and logging under ``save_dir``; returns
    each command's stderr. The processes are killed (their whole sessions) if they outlive the timeout."""
    base_env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    port = free_port()
    processes = []
    for env, argv in doc_commands(first_line, port):
        argv = [*argv, *SHORT_RUN, "--trainer.logger.init_args.save_dir", str(save_dir)]
        processes.append(subprocess.Popen(argv, cwd=ROOT, env={**base_env, **env}, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
    errors = []
    try:
        for process in processes:
            errors.append(process.communicate(timeout=300)[1])
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    for process, stderr in zip(processes, errors):
        assert process.returncode == 0, stderr[-3000:]
    return errors


def trained_adapter(save_dir: Path) -> dict[str, torch.Tensor]:
    (path,) = save_dir.rglob("adapter_model.safetensors")  # written by rank 0 only
    return load_file(path)


def epoch_rewards(stderr: str) -> list[str]:
    """Rank 0's per-epoch reward and accuracy (reduced over ranks): equal when the ranks drew the same rollouts."""
    return re.findall(r"epoch \d+: .*?; (reward mean [\d.]+, accuracy [\d.]+)", stderr)


def thread_reports(stderr: str) -> list[tuple[int, int]]:
    """``(processes on this machine, torch threads)`` of each process that wrote this stderr."""
    found = re.findall(r"lit-grpo: (\d+) processes share this machine's cores: (\d+) torch thread", stderr)
    return [(int(processes), int(threads)) for processes, threads in found]


CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The one-node, two-device run: Lightning starts rank 1 itself, so both ranks write to one stderr."""
    save_dir = tmp_path_factory.mktemp("one-node")
    (stderr,) = launch("# one node, two devices (tested)", save_dir)
    assert thread_reports(stderr) == [(2, max(1, CORES // 2))] * 2
    rewards = epoch_rewards(stderr)
    assert len(rewards) == 2
    return trained_adapter(save_dir), rewards


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """One process on the same 16 rollouts an epoch: its one minibatch of 16 is the union of the ranks' two of 8, so
    with the global loss normaliser (design §5) its step is theirs."""
    save_dir = tmp_path_factory.mktemp("one-process")
    command = [str(BIN / "lit-grpo"), "fit", "--config", "configs/quickstart.yaml", *SHORT_RUN,
               "--data.minibatch_size", "16", "--trainer.logger.init_args.save_dir", str(save_dir)]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return trained_adapter(save_dir)


def largest_difference(adapter: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    assert adapter.keys() == reference.keys() and len(reference) > 0
    return max((adapter[name] - reference[name]).abs().max().item() for name in reference)


@pytest.mark.slow
def test_one_node_with_two_devices_trains_the_one_process_adapter(one_node, one_process):
    difference = largest_difference(one_node[0], one_process)
    print(f"max |one node, two devices - one process| adapter difference: {difference:.2e}")
    assert difference <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["Lightning's launcher", "torchrun"])
def test_two_nodes_on_loopback_train_the_one_node_adapter(launcher, one_node, one_process, tmp_path):
    reference, reference_rewards = one_node
    errors = launch(f"# two nodes on loopback, {launcher} (tested)", tmp_path)
    assert len(errors) == 2  # two node commands, one process each
    for stderr in errors:  # each "node" took half the cores, not all of them
        assert thread_reports(stderr) == [(2, max(1, CORES // 2))]
    assert epoch_rewards(errors[0]) == reference_rewards  # the same rollouts, scored the same
    adapter = trained_adapter(tmp_path)
    difference, from_one_process = largest_difference(adapter, reference), largest_difference(adapter, one_process)
    print(f"{launcher}: max adapter difference from one node with two devices {difference:.2e}, from one process "
          f"{from_one_process:.2e}")
    assert difference <= 1e-6 and from_one_process <= 1e-6
    moved = max(value.abs().max().item() for name, value in reference.items() if "lora_B" in name)
    assert moved > 1e-4  # B starts at zero: the comparison is between adapters that trained


def test_processes_on_this_machine_count_every_node_of_a_loopback_launch():
    assert processes_on_this_machine(2, 1, "127.0.0.1") == 2  # two "nodes" here
    assert processes_on_this_machine(3, 2, "localhost") == 6
    assert processes_on_this_machine(2, 4, "10.0.0.7") == 4  # real nodes: this node's devices only
    assert processes_on_this_machine(2, 4, "node0") == 4  # a hostname, even one that resolves to 127.0.1.1 here
    assert processes_on_this_machine(2, 4, None) == 4


def test_fsdp_and_deepspeed_off_gpu_are_one_config_problem():
    cpu_fsdp = config_problems({"trainer": {"strategy": "fsdp", "accelerator": "cpu"}})
    assert cpu_fsdp == ["trainer.strategy fsdp with trainer.accelerator cpu: FSDP needs GPUs (Lightning runs it on "
                        "CUDA devices only); on CPU use --trainer.strategy ddp (with --trainer.accelerator cpu, "
                        "gloo), or run on GPUs with --trainer.accelerator gpu"]
    by_class = {"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy"}
    (deepspeed,) = config_problems({"trainer": {"strategy": by_class, "accelerator": "cpu"}})
    assert deepspeed.startswith(f"trainer.strategy {by_class['class_path']} with trainer.accelerator cpu: "
                                "DeepSpeed needs GPUs")
    for fine in ({"strategy": "ddp", "accelerator": "cpu"}, {"strategy": "fsdp", "accelerator": "gpu"}, {}):
        assert config_problems({"trainer": fine}) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto is CUDA on a GPU machine, where FSDP is allowed")
def test_cli_refuses_fsdp_on_cpu_with_one_message(capfd, monkeypatch):
    from lit_grpo.cli import main  # in this process: the command's own code path, without a second interpreter start

    monkeypatch.chdir(ROOT)  # the config's model path is relative to the checkout; nothing is written
    with pytest.raises(SystemExit) as exited:
        main(["fit", "--config", "configs/quickstart.yaml", "--trainer.strategy", "fsdp", "--trainer.devices", "2",
              "--trainer.logger", "false"])
    assert exited.value.code == 2
    assert capfd.readouterr().err.strip().splitlines() == [
        "lit-grpo: the configuration has 1 problem(s):",
        "  - trainer.strategy fsdp with trainer.accelerator auto (which is cpu on this machine): FSDP needs GPUs "
        "(Lightning runs it on CUDA devices only); on CPU use --trainer.strategy ddp (with --trainer.accelerator "
        "cpu, gloo), or run on GPUs with --trainer.accelerator gpu",
    ]


def test_the_command_destroys_its_process_group_before_the_interpreter_finalises(monkeypatch, tmp_path):
    """A gloo group of several ranks left to interpreter finalisation can abort a rank that finished (exit -6, seen on
    a CI run of the loopback launch above): the command destroys it itself, on a failing path too. A group of one
    process (an in-process vLLM engine's) is left to the engine's own shutdown."""
    from lit_grpo.cli import outcome as cli  # where main builds the command

    def refused(args):
        assert torch.distributed.is_initialized()  # the group lives while the run runs
        raise cli.InputError("a bad input")

    monkeypatch.setattr(cli, "LitGRPOCLI", refused)
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(SystemExit) as exited:
            cli.main(["fit"])
        assert exited.value.code == 2 and torch.distributed.is_initialized()  # one process: vLLM's to destroy
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)  # as a DDP rank sees it
        with pytest.raises(SystemExit):
            cli.main(["fit"])
        assert not torch.distributed.is_initialized()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
