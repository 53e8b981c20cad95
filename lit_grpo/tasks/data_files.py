"""Reading a task's rows, the one way data comes in: a data file by its type, a ``save_to_disk``
directory, a folder of data files, or a hub id already in the local cache; nothing is downloaded at run time.

JSON-lines files are read line by line (a bad line is named by its number; a column may hold strings in one row and
numbers in another); every other source goes through ``datasets``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

from lit_grpo.errors import InputError
from lit_grpo.run.model_files import shipped_path
from lit_grpo.tasks.file_problems import (
    datasets_reason,
    file_problem,
    folder_problem,
    json_syntax_problem,
    utf8_problem,
)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
SOURCES = f"a data file ({', '.join(FILE_BUILDERS)}), a save_to_disk directory, or a hub id already in the local cache"
Row = tuple[str, dict[str, Any]]  # where the row is (for messages), the row


@contextmanager
def offline() -> Iterator[None]:
    """Nothing is downloaded at run time: a hub id must already be in the local cache. ``datasets`` and
    ``huggingface_hub`` read ``HF_HUB_OFFLINE`` once, at import, so their flags are set for the duration (setting the
    variable alone would leave a lookup waiting on the network)."""
    import datasets.config
    import huggingface_hub.constants

    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    with ExitStack() as stack:
        for owner, name in flags:
            stack.enter_context(patch.object(owner, name, True))
        stack.enter_context(patch.dict(os.environ, {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}))
        yield


@contextmanager
def quiet_datasets() -> Iterator[None]:
    """``datasets`` without its progress bars and its own log lines (``Failed to load JSON from file ...`` before the
    error it raises): a file it cannot read gets lit-grpo's one message. Its settings are put back after."""
    import datasets

    bars_off, verbosity = datasets.are_progress_bars_disabled(), datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its errors are raised too: lit-grpo words them
    try:
        yield
    finally:
        datasets.logging.set_verbosity(verbosity)
        if not bars_off:
            datasets.enable_progress_bars()


def load_rows(path: str, split: str) -> list[Row]:
    """The rows of ``split`` of ``path`` (a single file holds one split, whatever its name), each with where it is:
    ``file:line`` for JSON lines, ``path [split] row N`` otherwise."""
    local = shipped_path(path)
    if local.suffix == ".jsonl" and local.is_file():
        return read_jsonl_rows(local)
    looks_local = local.suffix in FILE_BUILDERS or path.startswith((".", "/", "~")) or path.count("/") > 1
    if looks_local and not local.exists():
        raise InputError(f"data file {path!r} does not exist (data.task.path: {SOURCES})")
    refuse_unreadable(path, local)
    rows = load_dataset_rows(path, local, split)
    return [(f"{path} [{split}] row {number}", row) for number, row in enumerate(rows)]


def refuse_unreadable(path: str, local: Path) -> None:
    """Refuse, in the user's terms, a local data file (or a folder of them) that ``datasets`` would refuse in its
    own: empty, not UTF-8, a CSV of its header alone, not the format its suffix names (``file_problems``)."""
    if local.is_file() and local.suffix in FILE_BUILDERS:
        problem = file_problem(local)
    elif local.is_dir() and not ((local / "dataset_info.json").is_file() or (local / "dataset_dict.json").is_file()):
        problem = folder_problem(local, tuple(FILE_BUILDERS))
    else:
        return
    if problem is not None:
        raise InputError(f"data file {path!r} {problem} (data.task.path)")


def load_dataset_rows(path: str, local: Path, split: str) -> list[dict[str, Any]]:
    """``split`` of a file, a directory or a cached hub id, through ``datasets``. The rows are decoded inside the
    same guard as the load: a ``save_to_disk`` directory is memory-mapped unchecked, so a damaged Arrow body there
    first fails while its rows are read (a ``UnicodeDecodeError`` from a string column, say)."""
    import datasets

    saved = (local / "dataset_info.json").is_file() or (local / "dataset_dict.json").is_file()
    suffix = local.suffix if local.is_file() else "saved" if saved else ""
    try:
        with offline(), quiet_datasets():
            if local.suffix in FILE_BUILDERS and local.is_file():
                data = datasets.load_dataset(FILE_BUILDERS[local.suffix], data_files={split: str(local)}, split=split)
            elif saved:
                data = datasets.load_from_disk(str(local))
                if isinstance(data, datasets.DatasetDict) and split not in data:
                    raise InputError(f"data file {path!r} holds the splits {sorted(data)}, not {split!r} "
                                     "(data.task.path)")
                data = data[split] if isinstance(data, datasets.DatasetDict) else data
            else:  # a folder of data files, or a hub id in the cache
                data = datasets.load_dataset(str(local) if local.is_dir() else path, split=split)
            return [dict(row) for row in data]
    except InputError:
        raise
    except (FileNotFoundError, ValueError, KeyError, OSError, datasets.exceptions.DatasetNotFoundError,
            datasets.exceptions.DatasetGenerationError) as error:  # ValueError covers UnicodeDecodeError, ArrowInvalid
        reason = (json_syntax_problem(local) if suffix == ".json" else None) or datasets_reason(error, suffix)
        raise InputError(f"data file {path!r} (split {split!r}) {reason} (data.task.path: {SOURCES})") from None


def read_jsonl_rows(path: Path) -> list[Row]:
    """The objects of a JSON-lines file, blank lines skipped, each with ``file:line``."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"data file {str(path)!r} {utf8_problem(path) or 'is not UTF-8 text'}") from None
    except OSError as error:
        raise InputError(f"data file {str(path)!r} cannot be read: {error.strerror or error}") from None
    rows: list[Row] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
        rows.append((f"{path}:{number}", row))
    return rows
