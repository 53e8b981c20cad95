"""The evaluations file read back (``<log_dir>/evaluations.jsonl``, one JSON object per figure, written by
``RolloutMetrics``; fields: docs/guide.md#evaluating-the-base-model-and-an-adapter) and laid out as one table: a row
per evaluated weights (``checkpoint``, ``step``), a column per ``set/metric``, each cell ``value ± stderr``, as
markdown and as CSV (a ``<set>/<metric>`` column and its ``<set>/<metric>_stderr``). Standard library only: what a
notebook could do with ``json`` alone."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

Row = tuple[str, int | None]  # (checkpoint, step)


def read_evaluations(path: str | Path) -> list[dict[str, Any]]:
    """The figures of an evaluations file in file order (oldest first); blank lines skipped. A missing file is
    ``[]``."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def latest_figures(lines: list[dict[str, Any]]) -> dict[tuple[Row, str], dict[str, Any]]:
    """The last line (the newest evaluation) of each ``((checkpoint, step), set/metric)``: a checkpoint scored twice
    into one file shows its newest figures."""
    return {((str(line["checkpoint"]), line.get("step")), f"{line['set']}/{line['metric']}"): line for line in lines}


def row_order(row: Row) -> tuple[int, int, str]:
    """``base`` first, then by step (a row without one last), then by name."""
    checkpoint, step = row
    return (0 if checkpoint == "base" else 1, step if isinstance(step, int) else math.inf, checkpoint)  # type: ignore[return-value]


def cell(line: dict[str, Any] | None, digits: int = 4) -> str:
    """``value ± stderr`` (``value`` alone without a standard error; ``n/a`` for null; empty where not evaluated).
    Example: value 0.5, stderr 0.125 -> ``0.5000 ± 0.1250``."""
    if line is None:
        return ""
    value, stderr = line.get("value"), line.get("stderr")
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" + (f" ± {stderr:.{digits}f}" if stderr is not None else "")


def checkpoint_label(checkpoint: str) -> str:
    """A row's name: a checkpoint file's or adapter directory's own name (``epoch=2-step=6.ckpt``), else as written
    (``base``, ``training``)."""
    return Path(checkpoint).name if "/" in checkpoint else checkpoint


def evaluation_table(lines: list[dict[str, Any]]) -> tuple[list[Row], list[str], dict[tuple[Row, str], dict]]:
    """The rows (ordered by ``row_order``), the ``set/metric`` columns (in the order first seen) and the figure of
    each cell, from an evaluations file's lines."""
    figures = latest_figures(lines)
    rows = sorted({row for row, _ in figures}, key=row_order)
    columns = list(dict.fromkeys(column for _, column in figures))
    return rows, columns, figures


def markdown_table(lines: list[dict[str, Any]]) -> str:
    """The table in markdown: ``| checkpoint | step | <set>/<metric> ... |``, each cell ``value ± stderr``."""
    rows, columns, figures = evaluation_table(lines)
    out = ["| checkpoint | step | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for row in rows:
        cells = [cell(figures.get((row, column))) for column in columns]
        step = "" if row[1] is None else str(row[1])
        out.append(f"| {checkpoint_label(row[0])} | {step} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def csv_table(lines: list[dict[str, Any]]) -> str:
    """The table as CSV: ``checkpoint`` (as written in the file), ``step``, then ``<set>/<metric>`` and
    ``<set>/<metric>_stderr`` for each column; unrounded values, empty where unknown."""
    rows, columns, figures = evaluation_table(lines)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["checkpoint", "step", *(f"{c}{suffix}" for c in columns for suffix in ("", "_stderr"))])
    for row in rows:
        values = []
        for column in columns:
            line = figures.get((row, column)) or {}
            values += ["" if line.get(key) is None else repr(float(line[key])) for key in ("value", "stderr")]
        writer.writerow([row[0], "" if row[1] is None else row[1], *values])
    return text.getvalue()


def write_tables(lines: list[dict[str, Any]], target: str | Path) -> tuple[Path, Path]:
    """``<target>.md`` and ``<target>.csv`` written from ``lines``; their paths."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    markdown, table = target.with_suffix(".md"), target.with_suffix(".csv")
    markdown.write_text(markdown_table(lines), encoding="utf-8")
    table.write_text(csv_table(lines), encoding="utf-8")
    return markdown, table
