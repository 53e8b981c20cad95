"""The tables of docs/reliability.md written row by row (the faults; the data rows and reward answers), each row
written by the test that produced the fault from what it observed (``LIT_GRPO_WRITE_DOCS=1``), and otherwise checked
against the file, so that the document cannot say what the tests did not see."""

from __future__ import annotations

import os
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
START, END = "<!-- faults:start -->", "<!-- faults:end -->"
HEADER = ["| fault | what happened | test |", "|---|---|---|"]
# section -> (start marker, end marker, header); "faults" is the table above
SECTIONS = {
    "faults": (START, END, HEADER),
    "rows-and-rewards": ("<!-- rows-and-rewards:start -->", "<!-- rows-and-rewards:end -->",
                         ["| input | what happened | test |", "|---|---|---|"]),
}


def spliced(text: str, start: str, end: str, section: str) -> str:
    """``text`` with the part from ``start`` to ``end`` (markers included) replaced by ``section``, which must
    carry both markers; appended when the markers are missing."""
    if start not in text:
        return text + "\n" + section + "\n"
    head, _, rest = text.partition(start)
    return head + section + rest.partition(end)[2]


def fault_rows(text: str, section: str = "faults") -> dict[str, str]:
    """A section's rows by fault (its first cell)."""
    start, end, header = SECTIONS[section]
    part = text.partition(start)[2].partition(end)[0]
    rows = [line for line in part.strip().splitlines()[len(header):] if line.startswith("| ")]
    return {row.split(" | ")[0][2:]: row for row in rows}


def documented(fault: str, observed: str, test: str, section: str = "faults") -> None:
    """Write (LIT_GRPO_WRITE_DOCS=1) or check the row ``| fault | observed | test |`` of ``section``'s table; rows
    sorted by fault."""
    start, end, header = SECTIONS[section]
    row = "| " + " | ".join(cell.replace("|", "\\|") for cell in (fault, observed, f"`{test}`")) + " |"
    text = DOC.read_text()
    if os.environ.get("LIT_GRPO_WRITE_DOCS"):
        rows = fault_rows(text, section) | {fault: row}
        text = spliced(text, start, end, "\n".join([start, *header, *(rows[key] for key in sorted(rows)), end]))
        DOC.write_text(text)
    assert fault_rows(text, section).get(fault) == row, (
        f"docs/reliability.md does not say what {test} saw; rerun it with LIT_GRPO_WRITE_DOCS=1")
