"""Several runs' evaluations in one picture (issue 59, item 5): the ``evaluations.jsonl`` of each run (its validations
within fit, or a checkpoint sweep's, ``python -m lit_grpo.run.sweep``) read with ``json`` alone, one panel per
``set/metric`` chosen, each run a line over the steps with an interval ``value ± 1.96 stderr`` at each point where a
standard error is known (``mean@n``'s), and its base model (an ``evaluate_base`` evaluation in the same file) as a
dashed flat line.

    .venv/bin/python benchmarks/learning/evaluation_plot.py runs/quickstart/version_0 runs/quickstart/version_1/sweep \
        --panel val/accuracy --panel val/mean@8 --panel val/pass@4 --out evaluations.png

A run is named by its directory (``--label`` names them in order instead); a path may be a run's directory (its
``evaluations.jsonl``) or the file itself. Without ``--panel`` every ``set/metric`` the files hold gets one.
Nothing is measured here: it draws what the runs logged (``lit_grpo.run.evaluation_plots.runs_figure``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run by its path: the checkout on sys.path (benchmarks/README.md)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lit_grpo.run.evaluation_plots import runs_figure  # noqa: E402
from lit_grpo.run.evaluation_table import read_evaluations  # noqa: E402

EVALUATIONS_FILE = "evaluations.jsonl"


def evaluations_path(path: Path) -> Path:
    """A run's ``evaluations.jsonl``: ``path`` itself when it is a file, else the file in that directory."""
    return path if path.is_file() else path / EVALUATIONS_FILE


def run_label(path: Path) -> str:
    """A run's default name: its directory's path (``runs/quickstart/version_0``; a sweep: ``.../version_0/sweep``)."""
    return str(path.parent if path.is_file() else path)


def chosen_panels(runs: dict[str, list[dict]], panels: list[str] | None) -> list[tuple[str, str]]:
    """``(set, metric)`` of each ``--panel set/metric`` (split at the last ``/``: a metric name holds none); every
    pair the files hold, sorted, when none is chosen."""
    if panels:
        return [tuple(panel.rsplit("/", 1)) for panel in panels]  # type: ignore[misc]
    return sorted({(line["set"], line["metric"]) for lines in runs.values() for line in lines
                   if line.get("value") is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (or their evaluations.jsonl files)")
    parser.add_argument("--panel", action="append", help="a set/metric to draw (repeat it; default: all)")
    parser.add_argument("--label", action="append", help="a name for each run, in order (default: its path)")
    parser.add_argument("--out", type=Path, default=Path("evaluations.png"), help="the PNG to write")
    options = parser.parse_args(argv)
    labels = options.label or [run_label(path) for path in options.runs]
    if len(labels) != len(options.runs):
        parser.error(f"{len(labels)} --label for {len(options.runs)} runs: give one per run, or none")
    runs = {}
    for label, path in zip(labels, options.runs):
        file = evaluations_path(path)
        if not file.is_file():
            parser.error(f"{str(path)!r} holds no {EVALUATIONS_FILE} (a run's version_N directory, or a sweep's)")
        runs[label] = read_evaluations(file)
    panels = chosen_panels(runs, options.panel)
    found = {(line["set"], line["metric"]) for lines in runs.values() for line in lines}
    missing = [f"{s}/{m}" for s, m in panels if (s, m) not in found]
    if missing or not panels:
        parser.error(f"no figure for {', '.join(missing) or 'any panel'} in these runs; found: "
                     f"{', '.join(sorted(f'{s}/{m}' for s, m in found)) or 'none'}")
    figure = runs_figure(runs, panels)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(options.out, dpi=120)
    print(f"wrote {options.out}: {len(runs)} run(s), {len(panels)} panel(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
