"""Pictures of evaluations (docs/guide.md#pictures-of-evaluations), drawn with matplotlib (a dependency: the
risk-coverage image uses it too) off screen, from what the evaluations file holds (``evaluation_table``):

- ``pass_at_k_figure``: pass@k against k for one set at one evaluation;
- ``over_steps_figure``: each metric of one set over the training steps, the adapter's line against the base
  model's (a flat line: an ``evaluate_base`` evaluation's figure in the same file, else the step-0 validation's);
- ``runs_figure``: several runs' evaluations files in one picture, one panel per ``set/metric``, each point with
  its interval ``value ± 1.96 stderr`` where a standard error is known.

The points of each picture are pure functions (``pass_at_k_points``, ``step_series``, ``base_value``,
``interval``), tested by hand; the figures only draw them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

Z95 = 1.96  # a 95% normal interval: value ± 1.96 standard errors
PASS_AT = re.compile(r"pass@(\d+)")


def pass_at_k_points(metrics: dict[str, float]) -> list[tuple[int, float]]:
    """``(k, pass@k)`` of one evaluation's figures, by k. Example: {"pass@4": 0.7, "pass@1": 0.3, "mean@4": 0.2}
    -> [(1, 0.3), (4, 0.7)]."""
    points = [(int(m.group(1)), float(value)) for name, value in metrics.items()
              if (m := PASS_AT.fullmatch(name)) is not None and value is not None]
    return sorted(points)


def training_lines(lines: list[dict[str, Any]], evaluated_set: str) -> list[dict[str, Any]]:
    """A set's figures of the validations within fit (``checkpoint`` ``training``)."""
    return [line for line in lines if line.get("set") == evaluated_set and line.get("checkpoint") == "training"]


def step_series(lines: list[dict[str, Any]], evaluated_set: str, metric: str) -> list[tuple[int, float]]:
    """``(step, value)`` of ``metric`` over the training validations of ``evaluated_set``, by step; a step
    evaluated twice (a resumed run) keeps its last value; null values are left out."""
    series = {line["step"]: line["value"] for line in training_lines(lines, evaluated_set)
              if line.get("metric") == metric and line.get("value") is not None}
    return sorted(series.items())


def evaluated_base(lines: list[dict[str, Any]], evaluated_set: str, metric: str) -> list[float]:
    """The values of ``metric`` on ``evaluated_set`` of every ``evaluate_base`` evaluation in the file, in order."""
    return [float(line["value"]) for line in lines if line.get("checkpoint") == "base"
            and line.get("set") == evaluated_set and line.get("metric") == metric and line.get("value") is not None]


def base_value(lines: list[dict[str, Any]], evaluated_set: str, metric: str) -> tuple[float | None, str]:
    """The base model's ``metric`` on ``evaluated_set`` and where it comes from: the last ``evaluate_base``
    evaluation's figure in the file (``checkpoint`` ``base``), else the step-0 validation of fit (``step 0``: the
    weights training started from), else ``(None, "")``."""
    base = evaluated_base(lines, evaluated_set, metric)
    if base:
        return float(base[-1]), "base model"
    start = [value for step, value in step_series(lines, evaluated_set, metric) if step == 0]
    return (float(start[-1]), "step 0") if start else (None, "")


def interval(value: float, stderr: float | None) -> tuple[float, float]:
    """``(low, high)`` = value ∓ 1.96 stderr; the value itself twice without a standard error. Example: 0.5 and
    0.1 -> (0.304, 0.696)."""
    half = 0.0 if stderr is None else Z95 * stderr
    return value - half, value + half


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # off screen: no display, and safe in any thread
    from matplotlib import pyplot as plt

    return plt


def pass_at_k_figure(evaluated_set: str, metrics: dict[str, float], step: int) -> Any:
    """A matplotlib figure of pass@k against k for ``evaluated_set`` at ``step`` (``pass_at_k_points``)."""
    plt = pyplot()
    points = pass_at_k_points(metrics)
    figure, axes = plt.subplots(figsize=(4, 3))
    axes.plot([k for k, _ in points], [v for _, v in points], marker="o")
    axes.set(xlabel="k", ylabel="pass@k", title=f"{evaluated_set}: pass@k at step {step}", ylim=(-0.02, 1.02))
    axes.set_xticks([k for k, _ in points])
    figure.tight_layout()
    return figure


def over_steps_figure(lines: list[dict[str, Any]], evaluated_set: str, metrics: Sequence[str]) -> Any:
    """A matplotlib figure with one panel per metric of ``evaluated_set``: its training validations over the steps,
    and the base model's value as a dashed flat line (``base_value``) where known."""
    figure, panels = panel_grid(len(metrics), 4, 3)
    for axes, metric in zip(panels, metrics):
        series = step_series(lines, evaluated_set, metric)
        axes.plot([s for s, _ in series], [v for _, v in series], marker="o", label="adapter")
        base, source = base_value(lines, evaluated_set, metric)
        if base is not None:
            axes.axhline(base, linestyle="--", color="grey", label=source)
        axes.set(xlabel="step", title=f"{evaluated_set}/{metric}")
        axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


def panel_grid(count: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A matplotlib figure of ``count`` panels, three a row, each ``width`` x ``height`` inches: the figure and its
    first ``count`` axes (the rest of the last row hidden)."""
    columns = min(3, count)
    rows = -(-count // columns)
    figure, grid = pyplot().subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False)
    for axes in list(grid.flat)[count:]:
        axes.set_visible(False)
    return figure, list(grid.flat)[:count]


def run_points(lines: list[dict[str, Any]], evaluated_set: str, metric: str) -> list[tuple[int, float, float, float]]:
    """``(step, value, low, high)`` of one run's ``set/metric``: the training validations by step, each with its
    ``interval``; an evaluated checkpoint (``lit-grpo validate --ckpt_path``, the sweep's) where there is none."""
    chosen = [line for line in lines if line.get("set") == evaluated_set and line.get("metric") == metric
              and line.get("value") is not None and line.get("checkpoint") != "base"]
    by_step: dict[int, dict[str, Any]] = {}
    for line in chosen:
        by_step[int(line.get("step") or 0)] = line
    return [(step, line["value"], *interval(line["value"], line.get("stderr"))) for step, line in sorted(by_step.items())]


def runs_figure(runs: dict[str, list[dict[str, Any]]], panels: Sequence[tuple[str, str]]) -> Any:
    """One matplotlib figure of several runs (``label -> evaluations file lines``), one panel per ``(set, metric)``:
    each run's points over the steps with error bars ``value ± 1.96 stderr``, and its base model as a flat line where
    it was evaluated."""
    figure, panel_axes = panel_grid(len(panels), 4.5, 3.2)
    for axes, (evaluated_set, metric) in zip(panel_axes, panels):
        for index, (label, lines) in enumerate(runs.items()):
            points = run_points(lines, evaluated_set, metric)
            color = f"C{index}"
            axes.errorbar([p[0] for p in points], [p[1] for p in points],
                          yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]],
                          marker="o", capsize=3, color=color, label=label)
            base = evaluated_base(lines, evaluated_set, metric)
            if base:
                axes.axhline(base[-1], linestyle="--", color=color, alpha=0.6)
        axes.set(xlabel="step", title=f"{evaluated_set}/{metric}")
        axes.legend(fontsize="small")
    figure.tight_layout()
    return figure
