"""The evaluations file: each validation's and test's figures appended to ``<log_dir>/evaluations.jsonl``, one JSON
object a line, for a notebook to read without lit-grpo (``json.loads`` per line, ``pandas.read_json(path,
lines=True)``); the fields are docs/guide.md#evaluating-the-base-model-and-an-adapter's. ``RolloutMetrics`` writes it
(``evaluations_file``)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lit_grpo.policy.evaluation import GreedyEvaluation
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.rollout.eval_sets import set_evaluation
from lit_grpo.rollout.sampled import SampledEvaluation
from lit_grpo.run.sweep import EVALUATIONS_FILE  # the file a sweep reads back

GREEDY = ("reward", "return", "accuracy")  # one greedy answer per prompt (n 1, no seed)
STDERR = "_stderr"  # a figure's standard error across prompts is logged beside it under this suffix (mean@n's)


def finite(value: float | None) -> float | None:
    """``value``, or None (JSON's null) for NaN and infinities, which strict JSON readers refuse."""
    return value if value is not None and math.isfinite(value) else None


def figure_fields(metric: str, evaluation: SampledEvaluation | None) -> tuple[int, int | None, int | None]:
    """``(n, k, seed)`` of one figure: a greedy one (``reward``, ``return``, ``accuracy``) has n 1, no k and no seed;
    a sampled one the evaluation's n samples per prompt and seed, ``pass@k`` its k. Example: ``pass@4`` of 8 samples
    with seed 3 is (8, 4, 3)."""
    if metric in GREEDY or evaluation is None:
        return 1, None, None
    k = re.fullmatch(r"pass@(\d+)", metric)
    return evaluation.samples, int(k.group(1)) if k else None, evaluation.seed


def evaluation_lines(evaluated_set: str, metrics: dict[str, float], evaluation: SampledEvaluation | None,
                     about: dict[str, Any]) -> list[dict[str, Any]]:
    """One object per figure of ``metrics`` (an evaluation's figures by name, each ``<name>_stderr`` folded into its
    figure's ``stderr``): ``set``, ``metric``, ``value``, ``stderr`` (None where not known), ``n``, ``k``, ``seed``,
    then ``about``'s fields (``checkpoint``, ``stage``, ``step``, ``model``, ``time``)."""
    lines = []
    for metric, value in metrics.items():
        if metric.endswith(STDERR) and metric.removesuffix(STDERR) in metrics:
            continue
        n, k, seed = figure_fields(metric, evaluation)
        lines.append({"set": evaluated_set, "metric": metric, "value": finite(float(value)),
                      "stderr": finite(metrics.get(f"{metric}{STDERR}")), "n": n, "k": k, "seed": seed, **about})
    return lines


def lora_update_is_zero(module: torch.nn.Module) -> bool:
    """Whether every LoRA B matrix of ``module`` is zero: the adapter then changes no output (a fresh one)."""
    return all(not p.any() for name, p in module.named_parameters() if "lora_B" in name)


def logged_figures(module: torch.nn.Module) -> dict[str, float]:
    """The figures its held-out evaluation (``GreedyEvaluation``, a submodule: its metric states move with the
    policy) last logged, unrounded; empty for a module without one."""
    return next((dict(m.logged) for m in module.modules() if isinstance(m, GreedyEvaluation)), {})


def evaluated_weights(stage: str, ckpt_path: str | None, init_adapter: str | None, step: int,
                      module: torch.nn.Module) -> str:
    """What an evaluation scored: ``training`` (a validation within fit, at its ``step``), the checkpoint file, the
    ``init_adapter`` directory, ``base`` (an adapter that changes nothing: ``evaluate_base``, or no adapter given),
    or ``in memory`` (weights trained in this process, not saved as either)."""
    if stage == "fit":
        return "training"
    if ckpt_path:
        return str(ckpt_path)
    if step == 0 and init_adapter:
        return str(init_adapter)
    return "base" if step == 0 and lora_update_is_zero(module) else "in memory"


def by_set(metrics: dict[str, float]) -> dict[str | None, dict[str, float]]:
    """An evaluation's figures by the set they belong to: ``<set>/<figure>`` (a named set's, data.eval_sets) under
    its set, a bare ``<figure>`` (the task's split's) under None. Example: ``{"accuracy": 1, "b/pass@2": 0.5}``
    gives ``{None: {"accuracy": 1}, "b": {"pass@2": 0.5}}``."""
    sets: dict[str | None, dict[str, float]] = {}
    for name, value in metrics.items():
        evaluated_set, _, metric = name.rpartition("/")
        sets.setdefault(evaluated_set or None, {})[metric] = value
    return sets


def append_evaluation(trainer: pl.Trainer, pl_module: pl.LightningModule, evaluated_set: str,
                      checkpoint_step: int | None = None, images: bool = False) -> Path | None:
    """Append the module's last logged figures (``logged_figures``) to ``<log_dir>/evaluations.jsonl``, on rank 0,
    each under its set (a named set's name, else ``evaluated_set``: ``by_set``), with ``step`` the global step (a
    validation within fit), else ``checkpoint_step``, the step of the checkpoint evaluated, where one was loaded;
    with ``images``, draw each set's in TensorBoard (``evaluation_images``). The file written, or None (another
    rank, or no figures)."""
    metrics = logged_figures(pl_module)
    if trainer.global_rank != 0 or not metrics:
        return None
    hparams = pl_module.hparams
    datamodule = trainer.datamodule
    data = datamodule if isinstance(datamodule, RolloutDataModule) else None
    stage = getattr(trainer.state.fn, "value", str(trainer.state.fn))
    about = {"checkpoint": evaluated_weights(stage, trainer.ckpt_path, hparams.get("init_adapter"), trainer.global_step,
                                             pl_module),
             "stage": stage, "step": trainer.global_step if stage == "fit" or checkpoint_step is None else
             checkpoint_step, "model": str(hparams.get("model_name_or_path")),
             "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = Path(trainer.log_dir or trainer.default_root_dir) / EVALUATIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        for name, figures in by_set(metrics).items():
            evaluation = None if data is None else (
                data.held_out.evaluation if name is None else set_evaluation(data.eval_sets, name))
            for line in evaluation_lines(name or evaluated_set, figures, evaluation, about):
                handle.write(json.dumps(line, allow_nan=False) + "\n")
    if images:
        for name, figures in by_set(metrics).items():
            evaluation_images(trainer, name or evaluated_set, figures, path, stage == "fit")
    return path


def evaluation_images(trainer: pl.Trainer, evaluated_set: str, metrics: dict[str, float], path: Path,
                      training: bool) -> None:
    """TensorBoard images of an evaluation (``lit_grpo.run.evaluation_plots``): ``<set>/pass@k`` against k where
    pass@k was sampled, and within fit ``<set>/over_steps``, each figure over the run's validations so far (read
    back from ``path``) against the base model's line. Nothing without a logger that takes figures."""
    from lit_grpo.run.evaluation_plots import over_steps_figure, pass_at_k_figure, pass_at_k_points
    from lit_grpo.run.evaluation_table import read_evaluations

    logger = trainer.logger
    if logger is None or not hasattr(logger.experiment, "add_figure"):
        return
    experiment = logger.experiment
    step = trainer.global_step
    if pass_at_k_points(metrics):
        experiment.add_figure(f"{evaluated_set}/pass@k", pass_at_k_figure(evaluated_set, metrics, step), step)
    if training:
        names = [name for name in metrics if not name.endswith(STDERR)]
        figure = over_steps_figure(read_evaluations(path), evaluated_set, names)
        experiment.add_figure(f"{evaluated_set}/over_steps", figure, step)
