"""Several ranks, one algorithm (docs/scaling.md; the normalisers of docs/guide.md#the-math).

Each rank generates rollouts for its own contiguous share of the epoch's prompts and trains on them; advantages stay
inside groups, so no rank needs another's rollouts. What ranks must share is each loss's normaliser of each
optimizer step (the count over all ranks' minibatches of that step), the statistics that span the whole batch
(PPO's advantage whitening, GRPO's batch std) and the number of minibatches (a rank that stepped fewer times would
leave the others waiting in a gradient all-reduce forever).
"""

from __future__ import annotations

import os
from typing import Any

import torch


def rank_and_world(trainer: Any) -> tuple[int, int]:
    """``(global rank, world size)`` of a trainer; ``(0, 1)`` without one."""
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)


def rank_share(count: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(start, size)`` of rank ``rank``'s contiguous share of ``count`` prompts.

    >>> rank_share(8, 1, 2)
    (4, 4)
    """
    if count % world_size:  # a contract: rules.trainer_problems refused such a prompts_per_epoch before training
        raise ValueError(
            f"data.prompts_per_epoch ({count}) must be a multiple of the number of ranks ({world_size}): "
            "every rank trains on an equal share of the epoch's prompts"
        )
    size = count // world_size
    return rank * size, size


STEP_COUNTS = ("step_denominator", "step_value_tokens", "step_risk_rows")  # one normaliser per loss


def summed_over_ranks(values: torch.Tensor, strategy: Any, world_size: int) -> torch.Tensor:
    """``values`` summed elementwise over all ranks (itself with one rank), back on its own device."""
    if world_size == 1:
        return values
    return strategy.reduce(values.to(strategy.root_device), reduce_op="sum").to(values.device)


def global_moments(values: torch.Tensor, strategy: Any = None,
                   world_size: int = 1) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Count, mean and population std of ``values [M]`` pooled over every rank's (two passes: the squared
    deviations are summed around the pooled mean), as one process holding all of them computes them; mean and std
    in ``values``' dtype, 0 when no rank has any. Example: ranks with [1, 3] and [5]: 3, mean 3, std sqrt(8 / 3)."""
    pooled = values.double()
    count_and_sum = summed_over_ranks(torch.stack([pooled.new_tensor(float(pooled.numel())), pooled.sum()]),
                                      strategy, world_size)
    count = int(count_and_sum[0])
    if count == 0:
        return 0, values.new_tensor(0.0), values.new_tensor(0.0)
    mean = count_and_sum[1] / count
    squares = summed_over_ranks((pooled - mean).square().sum(), strategy, world_size)
    return count, mean.to(values.dtype), (squares / count).sqrt().to(values.dtype)


def global_step_denominators(batches: list[dict[str, torch.Tensor]], strategy: Any, world_size: int) -> None:
    """Replace each minibatch's step counts (``STEP_COUNTS``: each loss's count over its optimizer step on this
    rank) by the counts summed over all ranks, in place. Every rank must serve the same number of minibatches:
    checked here, where a mismatch is an error on every rank rather than a hang at the first missing all-reduce."""
    if world_size == 1:
        return
    device = strategy.root_device  # NCCL reduces CUDA tensors only
    counts = strategy.all_gather(torch.tensor([len(batches)], device=device)).cpu()  # [W, 1]
    if counts.min() != counts.max():
        raise RuntimeError(
            f"ranks would train on different numbers of minibatches ({counts.flatten().tolist()}), which the data "
            "module's padding (minibatch_padding) exists to prevent: a bug, to report with the config"
        )
    if not batches:
        return
    local = torch.stack([torch.stack([batch[key].float() for key in STEP_COUNTS]) for batch in batches])  # [B, 3]
    summed = strategy.reduce(local.to(device), reduce_op="sum").cpu()  # [num_batches, 3]
    for batch, counts in zip(batches, summed):
        batch.update(zip(STEP_COUNTS, counts))


def minibatch_padding(count: int, strategy: Any, world_size: int) -> int:
    """How many empty minibatches (``buffers.buffer.empty_minibatch``) this rank serves after its ``count`` so that
    every rank serves as many as the one with the most: tree and chain rollouts differ in size from rank to rank,
    and a rank that stepped fewer times would leave the others waiting in a gradient all-reduce. A collective:
    every rank calls it."""
    if world_size == 1:
        return 0
    counts = strategy.all_gather(torch.tensor([count], device=strategy.root_device)).cpu()  # [W, 1]
    return int(counts.max()) - count


def config_world_size(trainer_cfg: dict[str, Any]) -> int | None:
    """The number of ranks a config asks for (``trainer.devices`` a count or a list, times ``trainer.num_nodes``);
    None when it names none (``auto``), or no valid count, which the trainer's own checks report."""
    devices = trainer_cfg.get("devices", "auto")
    devices = len(devices) if isinstance(devices, list) else devices
    devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
    nodes = trainer_cfg.get("num_nodes", 1)
    if not isinstance(devices, int) or devices < 1 or not isinstance(nodes, int) or nodes < 1:
        return None
    return devices * nodes


def processes_on_this_machine(num_nodes: int, devices_per_node: int, main_address: str | None) -> int:
    """How many processes of a launch share this machine: ``devices_per_node``, or all ``num_nodes`` nodes' when
    the main address is a loopback one (every "node" then runs here: a loopback address reaches no other machine).
    Only a literal loopback address or ``localhost`` counts: node 0's own hostname may resolve to 127.0.1.1 on
    node 0 (Debian's /etc/hosts) while the other nodes reach it over the network.

    >>> processes_on_this_machine(2, 1, "127.0.0.1"), processes_on_this_machine(2, 4, "10.0.0.7")
    (2, 4)
    """
    import ipaddress

    try:
        loopback = main_address == "localhost" or ipaddress.ip_address(main_address or "").is_loopback
    except ValueError:  # a hostname
        loopback = False
    return num_nodes * devices_per_node if loopback else devices_per_node


def share_cores(trainer: Any) -> int:
    """Give each process of a multi-process launch its share of this machine's cores with Lightning's own rule
    (cores // processes, at least 1, unless ``OMP_NUM_THREADS`` is set), and return how many
    processes share them. Lightning's launchers apply it counting one node's processes only, so "nodes" on one
    machine each took every core and slowed each other down (two quickstart "nodes" on two cores: generation 2.7 to
    3.9 s an epoch with two threads each, 0.1 to 0.3 s with one). Runs before Lightning's launcher, whose own call
    then leaves the count as set here (it too defers to ``OMP_NUM_THREADS``: pinned in tests/test_private_apis.py)."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is None or trainer.num_nodes * trainer.num_devices == 1:
        return 1
    processes = processes_on_this_machine(trainer.num_nodes, trainer.num_devices, environment.main_address)
    if "OMP_NUM_THREADS" not in os.environ:  # the user's setting wins, as in Lightning
        threads = threads_per_process(usable_cores(), processes)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
    return processes


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS reports one, as Lightning counts them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_process(cores: int, processes: int) -> int:
    """Each process's share of the cores: ``cores // processes``, never below one thread."""
    return max(1, cores // processes)


def release_process_group() -> None:
    """Destroys the default process group of a run over several ranks while the interpreter is whole.

    Lightning destroys it at exit for NCCL only; a gloo group left to the interpreter's finalisation can abort the
    process (SIGABRT, "terminate called without an active exception": gloo's worker threads still hold work whose
    tensors need the GIL being torn down), a rank's successful run then exiting -6. Local, not a collective: safe
    on every path, whatever the other ranks are doing. A group of one process is an in-process vLLM engine's, which
    its own shutdown destroys (destroyed here first, that shutdown fails on it)."""
    if (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        torch.distributed.destroy_process_group()
