"""Every saved checkpoint of a run scored the same way, and one table (docs/guide.md#every-checkpoint-of-a-run):

    python -m lit_grpo.run.sweep runs/quickstart/version_0 --stride 2 --base -- --data.evaluation.samples 8

evaluates every ``stride``-th checkpoint the run kept (the last one always), and with ``--base`` the base model, each
by ``lit-grpo validate --config <the run's config.yaml> --ckpt_path <file>`` (``--model.evaluate_base true`` for the
base model): the command's own validation, the arguments after ``--`` added to every one. All of them log into one
directory (``<run>/sweep`` by default; ``--out``): their TensorBoard events, and their figures appended to its
``evaluations.jsonl``, from which ``sweep.md`` and ``sweep.csv`` are written (``evaluation_table``: a row per
checkpoint and its step, a column per ``set/metric``, ``value ± stderr``) and ``sweep.png`` (each metric over the
steps against the base model's line, ``evaluation_plots``).

A run keeps one checkpoint (``last.ckpt``) unless it asked for more: ``checkpoint.save_top_k: -1`` keeps every
epoch's as ``epoch=N-step=M.ckpt`` (``last.ckpt`` a link to the newest, not counted twice). ``--stride 3`` over ten
of them scores the 3rd, 6th, 9th and 10th. From Python: ``sweep(run, stride=..., base=...)``, whose ``validate``
argument runs one command line (a subprocess of this interpreter by default)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lit_grpo.errors import InputError
from lit_grpo.run.evaluation_table import read_evaluations, write_tables

EVALUATIONS_FILE = "evaluations.jsonl"  # the file RolloutMetrics appends to (callbacks/evaluations.py imports it)
STEP_IN_NAME = re.compile(r"step=(\d+)")
Validate = Callable[[list[str]], int]  # a `lit-grpo` command line (after the program name) -> its exit code


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint file of a run and the optimizer step it was saved at."""

    path: Path
    step: int


def checkpoint_step(path: Path) -> int:
    """The optimizer step a checkpoint was saved at: its name's ``step=M`` (Lightning's ``epoch=N-step=M.ckpt``),
    else its ``global_step`` (read weights-only)."""
    named = STEP_IN_NAME.search(path.name)
    if named:
        return int(named.group(1))
    from lit_grpo.run.resume import load_checkpoint_file

    return int(load_checkpoint_file(path).get("global_step", 0))


def checkpoints_dir(run: Path) -> Path:
    """``run``'s ``checkpoints/`` folder, or ``run`` itself when it holds the ``.ckpt`` files."""
    return run / "checkpoints" if (run / "checkpoints").is_dir() else run


def saved_checkpoints(run: str | Path) -> list[SavedCheckpoint]:
    """The checkpoint files a run kept, by step: every ``*.ckpt`` that is a file, a link (``last.ckpt`` naming the
    newest) left out, and a file at a step another one holds (``save_last: true`` beside a top k) counted once."""
    found: dict[int, SavedCheckpoint] = {}
    for path in sorted(checkpoints_dir(Path(run)).glob("*.ckpt"), key=lambda p: (p.name == "last.ckpt", p.name)):
        if path.is_symlink() or not path.is_file() or path.name.startswith("."):
            continue
        step = checkpoint_step(path)
        found.setdefault(step, SavedCheckpoint(path, step))
    return [found[step] for step in sorted(found)]


def strided(checkpoints: Sequence[SavedCheckpoint], stride: int) -> list[SavedCheckpoint]:
    """Every ``stride``-th of ``checkpoints`` (the stride-th, the 2·stride-th, ...) and the last one always.
    Example: 10 of them, stride 3 -> the 3rd, 6th, 9th and 10th; stride 1 -> all."""
    if stride < 1:
        raise InputError(f"--stride: must be >= 1 (every m-th checkpoint), got {stride}")
    chosen = [checkpoint for index, checkpoint in enumerate(checkpoints, start=1) if index % stride == 0]
    if checkpoints and (not chosen or chosen[-1] is not checkpoints[-1]):
        chosen.append(checkpoints[-1])
    return chosen


def sweep_logger(out: Path) -> str:
    """``trainer.logger`` for every validation of a sweep: TensorBoard writing into ``out`` itself (no
    ``version_N``), so their figures go to one ``evaluations.jsonl``."""
    return json.dumps({"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": str(out), "name": "", "version": ""}})


def validate_lines(config: Path, chosen: Sequence[SavedCheckpoint], base: bool, out: Path,
                   extra: Sequence[str] = ()) -> list[tuple[str, list[str]]]:
    """``(what, command line)`` of each validation of a sweep, the base model first."""
    common = ["validate", "--config", str(config), "--trainer.logger", sweep_logger(out)]
    lines = [("base model", [*common, "--model.evaluate_base", "true", *extra])] if base else []
    return lines + [(f"{c.path.name} (step {c.step})", [*common, "--ckpt_path", str(c.path), *extra]) for c in chosen]


def command_validate(arguments: list[str]) -> int:
    """``lit-grpo <arguments>`` in a child process of this interpreter (its output shown as it runs)."""
    return subprocess.run([sys.executable, "-m", "lit_grpo.cli", *arguments], check=False).returncode


@dataclass(frozen=True)
class SweepResult:
    """What a sweep wrote: the evaluations file, the table (markdown, CSV) and the picture."""

    evaluations: Path
    markdown: Path
    csv: Path
    picture: Path | None


def run_config(run: Path, config: str | Path | None) -> Path:
    """The configuration to validate with: ``config``, else the run's own ``config.yaml`` (beside ``checkpoints/``,
    which the command saved)."""
    if config is not None:
        if not Path(config).is_file():
            raise InputError(f"--config: {str(config)!r} is not a file; pass the run's config.yaml")
        return Path(config)
    for candidate in (run / "config.yaml", run.parent / "config.yaml"):
        if candidate.is_file():
            return candidate
    raise InputError(f"{str(run)!r} holds no config.yaml (the command saves one beside checkpoints/): pass "
                     "--config with the configuration the run trained with")


def sweep(run: str | Path, config: str | Path | None = None, stride: int = 1, base: bool = False,
          out: str | Path | None = None, extra: Sequence[str] = (), validate: Validate = command_validate,
          say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> SweepResult:
    """Score every ``stride``-th checkpoint of ``run`` (a run directory or its checkpoints folder) and, with
    ``base``, the base model, each by ``validate`` (module docstring); then write the table and the picture from
    ``<out>/evaluations.jsonl``. A validation that fails stops the sweep (``InputError`` naming it and its exit
    code) after the table of what was scored is written."""
    run = Path(run)
    if not run.is_dir():
        raise InputError(f"{str(run)!r} is not a directory; pass a run's directory (runs/<name>/version_N) or its "
                         "checkpoints folder")
    config_file = run_config(run, config)
    checkpoints = saved_checkpoints(run)
    if not checkpoints:
        raise InputError(f"{str(checkpoints_dir(run))!r} holds no checkpoint (*.ckpt); pass a run that saved some")
    chosen = strided(checkpoints, stride)
    target = Path(out) if out is not None else (run if run.name != "checkpoints" else run.parent) / "sweep"
    target.mkdir(parents=True, exist_ok=True)
    lines = validate_lines(config_file, chosen, base, target, extra)
    say(f"sweep: {len(chosen)} of {len(checkpoints)} checkpoint(s) (stride {stride})"
        + (" and the base model" if base else "") + f", logged to {target}")
    failed = None
    for number, (what, arguments) in enumerate(lines, start=1):
        say(f"sweep: [{number}/{len(lines)}] {what}")
        code = validate(arguments)
        if code != 0:
            failed = f"sweep: the validation of {what} ended with exit code {code}; the table holds what was scored"
            break
    result = write_results(target)
    say(f"sweep: wrote {result.markdown}, {result.csv}" + (f" and {result.picture}" if result.picture else ""))
    if failed:
        raise InputError(failed)
    return result


def write_results(target: Path) -> SweepResult:
    """``sweep.md``, ``sweep.csv`` and ``sweep.png`` of ``<target>/evaluations.jsonl``."""
    lines = read_evaluations(target / EVALUATIONS_FILE)
    markdown, table = write_tables(lines, target / "sweep")
    picture = None
    panels = sorted({(line["set"], line["metric"]) for line in lines if line.get("value") is not None})
    if panels:
        from lit_grpo.run.evaluation_plots import runs_figure

        figure = runs_figure({target.parent.name or "run": lines}, panels)
        picture = target / "sweep.png"
        figure.savefig(picture, dpi=100)
    return SweepResult(target / EVALUATIONS_FILE, markdown, table, picture)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lit_grpo.run.sweep RUN [--config C] [--stride M] [--base] [--out DIR] [-- validate arguments]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m lit_grpo.run.sweep", description=__doc__.split("\n\n")[0],
                                     epilog="Arguments after -- go to every lit-grpo validate (e.g. "
                                            "--data.evaluation.samples 8).")
    parser.add_argument("run", help="the run's directory (runs/<name>/version_N) or its checkpoints folder")
    parser.add_argument("--config", help="the configuration to validate with (default: the run's config.yaml)")
    parser.add_argument("--stride", type=int, default=1, help="score every m-th checkpoint (the last one always)")
    parser.add_argument("--base", action="store_true", help="score the base model too (model.evaluate_base)")
    parser.add_argument("--out", help="where the validations log and the table go (default: <run>/sweep)")
    options = parser.parse_args(argv)
    try:
        sweep(options.run, options.config, options.stride, options.base, options.out, extra)
    except InputError as error:
        print(f"lit-grpo sweep: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
