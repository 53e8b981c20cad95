"""The faults table of docs/reliability.md, one row per fault, each written by the test that produced the fault
from what it observed (``LIT_GRPO_WRITE_DOCS=1``), and otherwise checked against the file, so that the document
cannot say what the tests did not see."""

from __future__ import annotations

import os
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
START, END = "<!-- faults:start -->", "<!-- faults:end -->"
HEADER = ["| fault | what happened | test |", "|---|---|---|"]


def spliced(text: str, start: str, end: str, section: str) -> str:
    """``text`` with the part from ``start`` to ``end`` (markers included) replaced by ``section``, which must
    carry both markers; appended when the markers are missing."""
    if start not in text:
        return text + "\n" + section + "\n"
    head, _, rest = text.partition(start)
    return head + section + rest.partition(end)[2]


def fault_rows(text: str) -> dict[str, str]:
    """The faults section's rows by fault (its first cell)."""
    section = text.partition(START)[2].partition(END)[0]
    rows = [line for line in section.strip().splitlines()[len(HEADER):] if line.startswith("| ")]
    return {row.split(" | ")[0][2:]: row for row in rows}


def documented(fault: str, observed: str, test: str) -> None:
    """Write (LIT_GRPO_WRITE_DOCS=1) or check the row ``| fault | observed | test |``; rows sorted by fault."""
    row = "| " + " | ".join(cell.replace("|", "\\|") for cell in (fault, observed, f"`{test}`")) + " |"
    text = DOC.read_text()
    if os.environ.get("LIT_GRPO_WRITE_DOCS"):
        rows = fault_rows(text) | {fault: row}
        text = spliced(text, START, END, "\n".join([START, *HEADER, *(rows[key] for key in sorted(rows)), END]))
        DOC.write_text(text)
    assert fault_rows(text).get(fault) == row, (
        f"docs/reliability.md does not say what {test} saw; rerun it with LIT_GRPO_WRITE_DOCS=1")
