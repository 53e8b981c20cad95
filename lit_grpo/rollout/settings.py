"""RolloutDataModule's own argument checks, and where a restored run stands in Lightning's loop."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lit_grpo.buffers.protocols import SamplingPolicy
from lit_grpo.engines import RolloutEngine
from lit_grpo.errors import InputError
from lit_grpo.rollout.eval_sets import EvalSets, eval_sets_data_problems, eval_sets_problems
from lit_grpo.rollout.sampled import evaluation_problems
from lit_grpo.run.rules import TrainerFacts, cross_knob_problems
from lit_grpo.tasks import Task


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
    if args["branching"] is not None and (not args["branching"] or any(width < 1 for width in args["branching"])):
        problems.append(f"branching: needs one width >= 1 per round, got {args['branching']}")
    if args["reward_timeout"] is not None and args["reward_timeout"] <= 0:
        problems.append(f"reward_timeout: must be > 0 seconds or None, got {args['reward_timeout']}")
    if args["val_max_prompts"] is not None and args["val_max_prompts"] < 1:
        problems.append(f"val_max_prompts: must be >= 1 or None, got {args['val_max_prompts']}")
    return problems + evaluation_problems(args.get("evaluation")) + eval_sets_problems(args.get("eval_sets"))


def fit_problems(trainer: pl.Trainer, module: SamplingPolicy, settings: dict[str, Any], engine: RolloutEngine,
                 task: Task, stage: str) -> list[str]:
    """What the rules between knobs refuse of the module's, the data's and the trainer's settings (run/rules.py)."""
    # Lightning keeps the setting in no public attribute (pinned by tests/test_python_api.py)
    sampler = getattr(trainer._accelerator_connector, "use_distributed_sampler", False)
    # fresh rollouts every epoch matter to fit alone: validate and test train no epoch, so any reload setting runs
    reload = trainer.reload_dataloaders_every_n_epochs if stage == "fit" else None
    facts = TrainerFacts(trainer.world_size, sampler, reload)
    return cross_knob_problems(dict(module.model_arguments), settings, engine, task, facts) + held_out_problems(
        task, stage, trainer.enable_validation, settings.get("eval_sets"))


def held_out_problems(task: Task, stage: str, validates: bool, eval_sets: EvalSets = None) -> list[str]:
    """An evaluation of no prompt, said before the weights load: ``test`` on a task without a test split, a
    validation (``validate``, or one within ``fit``) of an empty validation split; with ``eval_sets``, every problem
    reading the sets (``eval_sets_data_problems``: unreadable, empty, overlapping training) instead of the latter."""
    if stage == "test":
        try:
            task.test_records()
        except InputError as refused:
            return [str(refused)]
    if stage in ("fit", "validate") and validates and eval_sets:
        return eval_sets_data_problems(task, eval_sets)
    if stage in ("fit", "validate") and validates and not task.validation_records():
        return [f"data.task: {type(task).__name__}'s validation split is empty: a validation would score no prompt; "
                "give the task held-out prompts, or turn validation off (trainer.limit_val_batches: 0)"]
    return []


def resuming_after_finished_epoch(trainer: pl.Trainer) -> bool:
    """True while Lightning restores a checkpoint written at the end of ``current_epoch`` (all its batches ran)."""
    progress = trainer.fit_loop.epoch_progress.total
    return progress.processed == progress.started and progress.completed == progress.processed - 1
