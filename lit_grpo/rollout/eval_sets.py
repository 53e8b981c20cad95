"""Named evaluation sets (docs/guide.md#named-evaluation-sets): ``data.eval_sets`` lists held-out sets scored at a
validation, each the task's own validation or test split or a data file, each with its own sampled evaluation,
prompt cap and interval. Each set is a ``HeldOutPrompts`` of its own (``held_out.py``) whose batches carry the set's
name, and is served as one of Lightning's validation dataloaders (``dataloader_idx``); the policy side logs each
under ``val/<set>/...``. Without ``eval_sets`` nothing here runs and ``val/*`` is what it always was."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cache, partial
from itertools import chain
from typing import Any, Literal

import lightning.pytorch as pl
from torch.utils.data import DataLoader

from lit_grpo.errors import InputError
from lit_grpo.rollout.held_out import HeldOutPrompts
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.sampled import SampledEvaluation, as_evaluation, evaluation_problems
from lit_grpo.run.model_files import shipped_path
from lit_grpo.tasks import DatasetTask, PromptRecord, Task
from lit_grpo.tasks.data_files import FILE_BUILDERS, load_rows
from lit_grpo.tasks.single_turn.dataset import prompt_key
from lit_grpo.tasks.rows import checked_record

SPLITS = ("validation", "test")  # the task's own held-out splits a set may name as its source
SET_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a metric path's segment (val/<set>/accuracy) and a module key
Overlap = Literal["refused", "allowed"]


@dataclass(frozen=True)
class EvalSet:
    """One named evaluation set of ``data.eval_sets``.

    Args:
        name: the set's name: metrics are logged as ``val/<name>/<metric>`` and ``evaluations.jsonl``'s ``set`` is
            it (letters, digits, ``_`` and ``-``); in the mapping form of ``eval_sets`` the key names the set.
        source: ``validation`` or ``test`` (the task's own split), or a data file (``.jsonl``, ``.json``,
            ``.parquet``, ``.csv``, ``.arrow``) or ``save_to_disk`` directory read as the task reads its data: a
            ``DatasetTask`` maps its columns; any other task takes ``prompt`` and ``answer`` columns.
        split: the split of a ``source`` directory (a single file holds one split, whatever its name).
        evaluation: this set's sampled evaluation (``SampledEvaluation``), replacing ``data.evaluation`` for it
            (None: ``data.evaluation``'s, greedy when that is unset).
        max_prompts: score only the set's first this many prompts (None: all of them).
        every_n_epochs: score the set at the validations that end epoch e with (e + 1) % every_n_epochs == 0 (the
            rule of ``trainer.check_val_every_n_epoch``: give a multiple of it); ``validate`` scores every set.
        overlap: ``refused``: a set sharing a prompt with the training split is refused before the model loads;
            ``allowed``: scored anyway.
        task: this set's own task, written as ``data.task`` is (``class_path`` and ``init_args``; None: the data
            module's task): its ``source`` is read as it reads its data (``validation``/``test``: its own splits) and
            its rewards score the set (bounded by ``data.reward_timeout`` as the data module's are).
    """

    name: str = ""
    source: str = "validation"
    split: str = "train"
    evaluation: SampledEvaluation | None = None
    max_prompts: int | None = None
    every_n_epochs: int = 1
    overlap: Overlap = "refused"
    task: Any = None


EvalSets = Mapping[str, Any] | Sequence[Any] | None  # data.eval_sets as given: by name, or a list with names


def entries(value: EvalSets) -> list[tuple[str, str | None, dict[str, Any]]]:
    """``(where, key, fields)`` of each set as given: ``eval_sets[name]`` or ``eval_sets[i]``, the mapping form's key
    (None in a list), and the set's fields as a mapping (a config's as written, an ``EvalSet``'s read off it)."""
    if value is None:
        return []
    value = plain(value)
    given = value.items() if isinstance(value, Mapping) else ((None, entry) for entry in value)
    return [(f"eval_sets[{key if key is not None else index}]", key,
             dict(plain(entry)) if not isinstance(entry, EvalSet) else {f.name: getattr(entry, f.name) for f in fields(EvalSet)})
            for index, (key, entry) in enumerate(given)]


def plain(value: Any) -> Any:
    """A set as the command's parsed config holds it, as the mapping it stands for: a jsonargparse ``Namespace`` as
    a dict, a dataclass in a union as its ``init_args`` (jsonargparse writes ``{class_path, init_args}``)."""
    value = value.as_dict() if callable(getattr(value, "as_dict", None)) else value
    if isinstance(value, Mapping) and "class_path" in value:
        value = value.get("init_args") or {}
    if not isinstance(value, Mapping):
        return value
    return {key: (task_mapping(item) if key == "task" else plain(item)) for key, item in value.items()}


def task_mapping(value: Any) -> Any:
    """A set's ``task`` as given, a jsonargparse ``Namespace`` as a dict, its ``class_path`` kept (``built_task``)."""
    return value.as_dict() if callable(getattr(value, "as_dict", None)) else value


def built_task(where: str, given: Any) -> Task | None:
    """A set's own task built from its ``class_path`` and ``init_args`` by jsonargparse, as the command builds
    ``data.task`` (None: the data module's); ``InputError`` naming the set where it cannot be built."""
    if given is None or isinstance(given, Task):
        return given
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--task", type=Task)
    try:
        return parser.instantiate_classes(parser.parse_object({"task": given})).task
    except InputError as refused:
        raise InputError(f"{where}.task: {refused}") from None
    except Exception as refused:  # jsonargparse's parse errors: an unknown class, a bad argument
        raise InputError(f"{where}.task: {str(refused).splitlines()[0]}; give a Task subclass's class_path and its "
                         "init_args, as data.task") from None


def named_sets(value: EvalSets) -> list[EvalSet]:
    """``data.eval_sets`` as ``EvalSet``s with their names (a config's or a checkpoint's mappings built), in order."""
    sets = []
    for where, key, given in entries(value):
        spec = EvalSet(**{**given, "evaluation": as_evaluation(given.get("evaluation")),
                          "task": built_task(where, given.get("task"))})
        sets.append(replace(spec, name=key) if key is not None else spec)
    return sets


def source_problem(where: str, source: str) -> str | None:
    """A set's ``source`` that names no split and no readable file or directory."""
    if source in SPLITS:
        return None
    path = shipped_path(source)
    if not path.exists():
        return (f"{where}.source: {source!r} is neither a split ({' or '.join(SPLITS)}) nor an existing data file: "
                "give the file's path (relative to where you run, or to the checkout)")
    if path.is_file() and path.suffix not in FILE_BUILDERS:
        return f"{where}.source: {source!r} is not a data file lit-grpo reads ({', '.join(FILE_BUILDERS)})"
    return None


def eval_sets_problems(value: EvalSets) -> list[str]:
    """Every problem of ``data.eval_sets`` seen without the task's data: unknown fields, names missing, malformed or
    given twice, a ``source`` that does not exist, an ``evaluation`` override's own problems (k > samples, ...), an
    interval or a prompt cap below 1. Reading the sets is ``eval_sets_data_problems``'."""
    problems, known = [], {f.name for f in fields(EvalSet)}
    checked: list[tuple[str, EvalSet]] = []
    for where, key, given in entries(value):
        if set(given) - known:
            problems.append(f"{where}: unknown field(s) {', '.join(sorted(set(given) - known))}; fields: "
                            f"{', '.join(f.name for f in fields(EvalSet))}")
        found = evaluation_problems(given.get("evaluation"))
        problems += [f"{where}.{problem}" for problem in found]
        given = {k: v for k, v in given.items() if k in known and not (k == "evaluation" and found)}
        try:
            task = built_task(where, given.get("task"))
        except InputError as refused:
            problems.append(str(refused))
            task = None
        spec = EvalSet(**{**given, "evaluation": as_evaluation(given.get("evaluation")), "task": task})
        checked.append((where, replace(spec, name=key) if key is not None else spec))
    seen: dict[str, str] = {}
    for where, spec in checked:
        if not SET_NAME.fullmatch(spec.name or ""):
            problems.append(f"{where}.name: {spec.name!r}: give each set a name of letters, digits, _ and - (it "
                            "becomes val/<name>/...)")
        elif spec.name in seen:
            problems.append(f"{where}.name: {spec.name!r} names {seen[spec.name]} too: give each set its own name")
        seen.setdefault(spec.name, where)
        problems += [problem for problem in [source_problem(where, spec.source)] if problem]
        if spec.max_prompts is not None and spec.max_prompts < 1:
            problems.append(f"{where}.max_prompts: must be >= 1 or None (every prompt), got {spec.max_prompts}")
        if spec.every_n_epochs < 1:
            problems.append(f"{where}.every_n_epochs: must be >= 1, got {spec.every_n_epochs}")
    return problems


def set_records(task: Task, spec: EvalSet) -> list[PromptRecord]:
    """The prompts of one set, every one (``max_prompts`` is the loader's): the task's split, or the rows of the
    file as the task reads its own (``InputError`` naming what cannot be read); the set's own task's where it has
    one."""
    task = spec.task or task
    if spec.source == "validation":
        return list(task.validation_records())
    if spec.source == "test":
        return list(task.test_records())
    if isinstance(task, DatasetTask):  # its columns mapped and its rows checked as its own are
        return task.records(spec.source, spec.split)
    rows = load_rows(spec.source, spec.split)
    return [checked_record(where, row, "prompt", "answer", compared=True) for where, row in rows]


def eval_sets_data_problems(task: Task, value: EvalSets) -> list[str]:
    """Every problem found reading the sets, before the model loads: a file that cannot be read, a set of no prompt,
    a set sharing prompts with the training split (unless it says ``overlap: allowed``)."""
    problems, training = [], None
    for spec in named_sets(value):
        where = f"data.eval_sets[{spec.name}]"
        try:
            records = set_records(task, spec)
        except InputError as refused:
            problems.append(f"{where}: {refused}")
            continue
        if not records:
            problems.append(f"{where}: the set holds no prompt ({spec.source!r}): give it prompts, or drop the set")
            continue
        if spec.overlap == "allowed":
            continue
        training = {prompt_key(r) for r in task.train_records()} if training is None else training
        shared = [key for key in dict.fromkeys(prompt_key(r) for r in records) if key in training]
        if shared:
            problems.append(f"{where}: {len(shared)} of its prompts are training prompts (e.g. {shared[0]!r:.60}): a "
                            "score on them is no held-out score; remove them, or say overlap: allowed")
    return problems


def held_out_sets(held_out: HeldOutPrompts, value: EvalSets) -> list[HeldOutPrompts]:
    """One ``HeldOutPrompts`` per named set, as ``held_out`` (the data module's: task, engine, scorer, batch size)
    but for the set's records, prompt cap and evaluation, its batches carrying its name; a set with its own task
    is scored by it (in a ``RewardWorker`` of its own where the data module's scorer is one: ``close_sets``)."""
    sets = []
    for spec in named_sets(value):
        evaluation = spec.evaluation if spec.evaluation is not None else held_out.evaluation
        read = partial(set_records, held_out.task, spec)  # a split read each time: the prompt check may drop some
        task, scorer, rounds = held_out.task, held_out.scorer, held_out.rounds
        if spec.task is not None:
            task, rounds = spec.task, getattr(spec.task, "max_rounds", None)
            scorer = RewardWorker(task, held_out.scorer.timeout) if isinstance(held_out.scorer, RewardWorker) else task
        sets.append(replace(held_out, task=task, scorer=scorer, rounds=rounds, max_prompts=spec.max_prompts,
                            evaluation=evaluation, name=spec.name, every_n_epochs=spec.every_n_epochs,
                            source=read if spec.source in SPLITS else cache(read)))
    return sets


def close_scoring(held_out: HeldOutPrompts, sets: Sequence[HeldOutPrompts]) -> None:
    """Close what scoring opened: the data module's reward worker and task (``held_out``'s: a tool task's worker
    process), then each set's own where it has its own task."""
    for held in [held_out, *(s for s in sets if s.task is not held_out.task)]:
        if isinstance(held.scorer, RewardWorker):
            held.scorer.close()
        held.task.close()


def due_sets(sets: Sequence[HeldOutPrompts], trainer: pl.Trainer | None) -> list[HeldOutPrompts]:
    """The sets a validation scores now: every one outside ``fit`` (or outside a trainer); within it, those whose
    ``every_n_epochs`` divides the number of the epoch the validation ends (``current_epoch + 1``)."""
    if trainer is None or getattr(trainer.state.fn, "value", trainer.state.fn) != "fit":
        return list(sets)
    return [s for s in sets if (trainer.current_epoch + 1) % s.every_n_epochs == 0]


def set_evaluation(sets: Sequence[HeldOutPrompts], name: str) -> SampledEvaluation | None:
    """The sampled evaluation the set ``name`` is scored with (None: greedy, or no such set)."""
    return next((s.evaluation for s in sets if s.name == name), None)


def as_batches(loaders: DataLoader | list[DataLoader]) -> Iterable[Any]:
    """A validation's batches in order, from its one loader or from one loader per set."""
    return loaders if isinstance(loaders, DataLoader) else chain.from_iterable(loaders)
