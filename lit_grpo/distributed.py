"""Several ranks, one algorithm (design §2 DDP notes, §5 normalisers).

Each rank generates rollouts for its own contiguous share of the epoch's prompts and trains on them; advantages stay
inside groups, so no rank needs another's rollouts. What ranks must share is the loss normaliser of each optimizer
step (the count over all ranks' minibatches of that step) and the number of minibatches (a rank that stepped
fewer times would leave the others waiting in a gradient all-reduce forever).
"""

from __future__ import annotations

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
    if count % world_size:
        raise ValueError(
            f"data.prompts_per_epoch ({count}) must be a multiple of the number of ranks ({world_size}): "
            "every rank trains on an equal share of the epoch's prompts"
        )
    size = count // world_size
    return rank * size, size


def check_distributed_data(trainer: Any, datamodule: Any) -> None:
    """Options that would let ranks draw different numbers of minibatches, refused with more than one rank."""
    if trainer.world_size == 1:
        return
    problems = []
    if getattr(trainer._accelerator_connector, "use_distributed_sampler", False):
        problems.append("Trainer(use_distributed_sampler=False) is needed: each rank's buffer is already its share "
                        "(the lit-grpo CLI sets it)")
    if datamodule.dynamic_sampling:
        problems.append("data.dynamic_sampling: ranks would keep different numbers of groups; not supported with "
                        "more than one rank")
    if datamodule.completion_budget is not None:
        problems.append("data.completion_budget: counted per process; not supported with more than one rank")
    if problems:
        raise ValueError(f"{trainer.world_size} ranks: " + "; ".join(problems))


def global_step_denominators(batches: list[dict[str, torch.Tensor]], strategy: Any, world_size: int) -> None:
    """Replace each minibatch's ``step_denominator`` (its optimizer step's count on this rank) by the count summed
    over all ranks, in place. Every rank must serve the same number of minibatches: checked here, where a mismatch
    is an error on every rank rather than a hang at the first missing all-reduce."""
    if world_size == 1:
        return
    device = strategy.root_device  # NCCL reduces CUDA tensors only
    counts = strategy.all_gather(torch.tensor([len(batches)], device=device)).cpu()  # [W, 1]
    if counts.min() != counts.max():
        raise RuntimeError(
            f"ranks would train on different numbers of minibatches ({counts.flatten().tolist()}): their rollouts "
            "differ in size (tree or chain rollouts?); use equal-size grouped rollouts with more than one rank"
        )
    if not batches:
        return
    local = torch.stack([batch["step_denominator"].float() for batch in batches]).to(device)  # [num_batches]
    summed = strategy.reduce(local, reduce_op="sum")  # [num_batches]
    for batch, denominator in zip(batches, summed.cpu()):
        batch["step_denominator"] = denominator


def distributed_config_problems(trainer_cfg: dict[str, Any], data_args: dict[str, Any]) -> list[str]:
    """The checks of ``check_distributed_data`` and ``rank_share`` on a config, when its world size is known
    (``trainer.devices`` a count, times ``trainer.num_nodes``)."""
    devices = trainer_cfg.get("devices", "auto")
    devices = len(devices) if isinstance(devices, list) else devices
    devices = int(devices) if isinstance(devices, str) and devices.isdigit() else devices
    if not isinstance(devices, int) or devices < 1:
        return []
    world_size = devices * int(trainer_cfg.get("num_nodes", 1))
    if world_size == 1:
        return []
    problems = []
    if data_args["prompts_per_epoch"] % world_size:
        problems.append(f"data.prompts_per_epoch: {data_args['prompts_per_epoch']} is not a multiple of the "
                        f"{world_size} ranks; every rank trains on an equal share of the epoch's prompts")
    if data_args["dynamic_sampling"]:
        problems.append(f"data.dynamic_sampling: not supported with {world_size} ranks (ranks would keep different "
                        "numbers of groups)")
    if data_args["completion_budget"] is not None:
        problems.append(f"data.completion_budget: not supported with {world_size} ranks (counted per process)")
    if trainer_cfg.get("use_distributed_sampler") is True:
        problems.append("trainer.use_distributed_sampler: must be false; each rank's buffer is already its share")
    return problems
