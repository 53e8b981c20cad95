"""What is wrong with a data file, in the user's terms, found before ``datasets`` reads it (its own words are
``Instruction "train" corresponds to no data!`` for a CSV holding only its header, ``An error occurred while
generating the dataset`` for a Latin-1 CSV): an empty file, text that is not UTF-8 (and which encoding it seems to
be), a CSV with no row below its header, a JSON file holding an empty list, an Arrow or Parquet file that is not one
(damaged, truncated, or another format under that suffix). ``datasets_reason`` says the same for what only
``datasets`` finds."""

from __future__ import annotations

import codecs
import csv
import json
import re
from pathlib import Path

TEXT_SUFFIXES = (".csv", ".json", ".jsonl")
CHUNK = 1 << 20  # bytes read at a time: a multi-gigabyte CSV is checked without being held whole
ARROW_STREAM = b"\xff\xff\xff\xff"  # an Arrow IPC stream's first message (what ``datasets`` writes)
ARROW_FILE = b"ARROW1"  # an Arrow IPC file's magic, at its start and end
PARQUET = b"PAR1"  # a Parquet file's magic, at its start and end


def guessed_encoding(sample: bytes) -> str:
    """The encoding a text that is not UTF-8 seems to be in, from its first bytes ``sample``: a byte-order mark
    names UTF-32 or UTF-16; a NUL in most odd (even) positions is UTF-16 LE (BE) without one; bytes 0x80-0x9F, which
    Latin-1 leaves to control codes and Windows-1252 prints (``€``, ``“``, ``”``), say Windows-1252; any other text
    reads as Latin-1 (ISO-8859-1).

    >>> guessed_encoding("café".encode("latin-1"))
    'Latin-1 (ISO-8859-1)'
    >>> guessed_encoding("“café”".encode("cp1252"))
    'Windows-1252'
    """
    for mark, name in ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                       (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16")):
        if sample.startswith(mark):
            return name
    pairs = len(sample) // 2
    if pairs and sum(sample[i] == 0 for i in range(1, 2 * pairs, 2)) > pairs // 2:
        return "UTF-16 LE"
    if pairs and sum(sample[i] == 0 for i in range(0, 2 * pairs, 2)) > pairs // 2:
        return "UTF-16 BE"
    try:
        sample.decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D are unassigned in Windows-1252
        return "Latin-1 (ISO-8859-1)"
    return "Windows-1252" if any(0x80 <= byte <= 0x9F for byte in sample) else "Latin-1 (ISO-8859-1)"


def utf8_problem(path: Path) -> str | None:
    """Why ``path`` is not UTF-8 text (where its first bad byte is, the encoding it seems to be, how to convert
    it); None when it is."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as file:
        sample, offset, lines = file.read(CHUNK), 0, 1
        chunk = sample
        while chunk:
            try:
                decoder.decode(chunk, final=len(chunk) < CHUNK)
            except UnicodeDecodeError as error:
                position = offset + error.start
                line = lines + chunk[:error.start].count(b"\n")
                encoding = guessed_encoding(sample)
                source = "latin1" if encoding.startswith("Latin") else encoding.split()[0].lower()
                return (f"is not UTF-8 text (byte 0x{chunk[error.start]:02X} at offset {position}, line {line}); it "
                        f"seems to be {encoding}: save it as UTF-8 (e.g. iconv -f {source} -t utf-8)")
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
            chunk = file.read(CHUNK)
    return None


def csv_problem(path: Path) -> str | None:
    """A UTF-8 CSV with no row of data: blank, or its header alone."""
    with path.open(encoding="utf-8", newline="") as file:
        records = []
        for record in csv.reader(file):
            if any(field.strip() for field in record):
                records.append(record)
            if len(records) == 2:
                return None
    if not records:
        return "holds no CSV rows (only blank lines)"
    return f"holds only its header row ({','.join(records[0])!s:.80}): no rows of data below it"


def json_problem(path: Path) -> str | None:
    """A UTF-8 ``.json`` file with no row: only whitespace, or an empty list or object."""
    with path.open(encoding="utf-8") as file:
        head = file.read(64).strip()
    if not head:
        return "holds no JSON (only whitespace)"
    if re.fullmatch(r"\[\s*\]|\{\s*\}", head):
        return f"holds an empty JSON {'list' if head.startswith('[') else 'object'}: no rows"
    return None


def json_syntax_problem(path: Path) -> str | None:
    """Where a UTF-8 ``.json`` file is not JSON, by Python's parser (``datasets``' own says ``Unexpected character
    found when decoding 'null'``): as JSON lines when its first line is an object alone, else as one document."""
    text = path.read_text(encoding="utf-8")
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    try:
        as_lines = bool(lines) and isinstance(json.loads(lines[0][1]), dict)
    except json.JSONDecodeError:
        as_lines = False
    for number, line in lines if as_lines else []:
        try:
            json.loads(line)
        except json.JSONDecodeError as error:
            return f"is not valid JSON lines: line {number}, column {error.colno}: {error.msg}"
    if as_lines:
        return None
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return (f"is not valid JSON: line {error.lineno}, column {error.colno}: {error.msg} (a .json file holds one "
                "JSON document, or one object per line)")
    return None


def binary_problem(path: Path, suffix: str) -> str | None:
    """An Arrow or Parquet file without its format's marker: damaged, truncated, or another format."""
    with path.open("rb") as file:
        head = file.read(8)
        file.seek(max(path.stat().st_size - 4, 0))
        tail = file.read(4)
    if suffix == ".parquet" and not (head.startswith(PARQUET) and tail == PARQUET):
        return ("is not a Parquet file (a Parquet file starts and ends with PAR1): it is truncated or damaged, or "
                f"another format under the .parquet suffix{seems_text(head)}")
    if suffix == ".arrow" and not head.startswith((ARROW_STREAM, ARROW_FILE)):
        return ("is not an Arrow file (it lacks the Arrow format's opening marker): it is damaged, or another format "
                f"under the .arrow suffix{seems_text(head)}")
    return None


def seems_text(head: bytes) -> str:
    """``; it starts as text ("...")`` when the first bytes of a binary format's file read as text."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return f"; it starts as text ({text!r}): give it the suffix of its format" if text.isprintable() else ""


def file_problem(path: Path) -> str | None:
    """What is wrong with the data file ``path`` before it is read, in the user's terms; None when nothing is
    found (``datasets`` may still find something: ``datasets_reason``)."""
    suffix = path.suffix.lower()
    if path.stat().st_size == 0:
        return "is empty (0 bytes)"
    if suffix in TEXT_SUFFIXES:
        problem = utf8_problem(path)
        if problem is None and suffix == ".csv":
            problem = csv_problem(path)
        if problem is None and suffix == ".json":
            problem = json_problem(path)
        return problem
    if suffix in (".arrow", ".parquet"):
        return binary_problem(path, suffix)
    return None


def folder_problem(folder: Path, suffixes: tuple[str, ...]) -> str | None:
    """A folder given as a data source: no data file in it, or the first data file in it with a problem
    (``file_problem``), named."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in suffixes)
    if not files and not any(p.is_file() for p in folder.rglob("*")):
        return f"holds no data files ({', '.join(suffixes)})"
    for file in files:
        problem = file_problem(file)
        if problem is not None:
            return f"holds {str(file.relative_to(folder))!r}, which {problem}"
    return None


def datasets_reason(error: BaseException, suffix: str) -> str:
    """What a ``datasets`` error reading a file of ``suffix`` (``""`` for a folder or a hub id, ``"saved"`` for a
    ``save_to_disk`` directory, whose Arrow files are read unchecked until a row is decoded) says about it, in
    the user's terms: the cause it wraps (a ``DatasetGenerationError`` hides the reader's own error in its
    ``__cause__``); an Arrow or Parquet file whose reader failed is damaged, whatever the reader's error (a
    truncated Arrow file has ended in a ``UnicodeDecodeError``)."""
    chain = [error]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    cause = chain[-1]
    first_line = str(cause).splitlines()[0] if str(cause) else ""
    if suffix == "saved":
        return (f"is a save_to_disk directory whose Arrow data is damaged (truncated or corrupted; its reader says "
                f"{type(cause).__name__}: {first_line})")
    if suffix in (".arrow", ".parquet"):
        return (f"is a damaged {suffix[1:].capitalize()} file (truncated or corrupted; its reader says "
                f"{type(cause).__name__}: {first_line})")
    for link in chain:
        if isinstance(link, UnicodeDecodeError):
            return "is not UTF-8 text"
        if "corresponds to no data" in str(link):
            return "holds no rows"
        if "doesn't contain any data files" in str(link):
            return "holds no data files"
    return f"cannot be read: {type(cause).__name__}: {first_line}"
