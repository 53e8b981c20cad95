"""The rows a benchmark keeps in a results file (``benchmarks/results/*.jsonl``): one JSON object a line, appended as
each run or seed finishes, so a rerun skips what is there and the report re-reads them without running anything."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every row of ``path`` in file order (none if there is no file yet)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """``row`` as the last line of ``path`` (its folder made), under a lock: two runs may finish at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.write(json.dumps(row) + "\n")
