"""RolloutDataModule's own argument checks, and where a restored run stands in Lightning's loop."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl


def data_config_problems(args: dict[str, Any]) -> list[str]:
    """Every problem with RolloutDataModule's own argument values beyond their choices
    (``RolloutDataModule.config_problems`` adds those, read off the signature's ``Literal`` types). Rules between
    knobs are ``lit_grpo.run.rules``'s."""
    problems = []
    for name in ("group_size", "prompts_per_epoch", "minibatch_size", "ppo_epochs", "max_new_tokens", "val_batch_size",
                 "max_sampling_rounds"):
        if args[name] < 1:
            problems.append(f"{name}: must be >= 1, got {args[name]}")
    if args["temperature"] <= 0:
        problems.append(f"temperature: must be > 0 for sampled rollouts, got {args['temperature']}")
    if not args["branching"] or any(width < 1 for width in args["branching"]):
        problems.append(f"branching: needs one width >= 1 per round, got {args['branching']}")
    if args["reward_timeout"] is not None and args["reward_timeout"] <= 0:
        problems.append(f"reward_timeout: must be > 0 seconds or None, got {args['reward_timeout']}")
    if args["val_max_prompts"] is not None and args["val_max_prompts"] < 1:
        problems.append(f"val_max_prompts: must be >= 1 or None, got {args['val_max_prompts']}")
    return problems


def resuming_after_finished_epoch(trainer: pl.Trainer) -> bool:
    """True while Lightning restores a checkpoint written at the end of ``current_epoch`` (all its batches ran)."""
    progress = trainer.fit_loop.epoch_progress.total
    return progress.processed == progress.started and progress.completed == progress.processed - 1
