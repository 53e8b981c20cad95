"""What one sandboxed call may use (docs/guide.md#a-python-sandbox): the numbers, checked up front."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MB = 2**20


@dataclass(frozen=True)
class Limits:
    """One call's limits. Each one passed ends the call as a failure the model reads.

    Args:
        wall_seconds: wall-clock time, from the start of the code's process.
        cpu_seconds: CPU time of each process (``RLIMIT_CPU``).
        memory_bytes: address space of each process (``RLIMIT_AS``), and resident memory of all of them together
            (the supervisor's watch).
        processes: processes at once (``RLIMIT_NPROC``, and the supervisor's count).
        file_bytes: the largest file a process may write (``RLIMIT_FSIZE``).
        scratch_bytes: all the files of the scratch directory together (the supervisor's watch).
        open_files: open file descriptors of each process (``RLIMIT_NOFILE``).
        output_bytes: stdout and stderr together; past it the call is stopped and the output cut there.
    """

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 512 * MB
    processes: int = 32
    file_bytes: int = 16 * MB
    scratch_bytes: int = 64 * MB
    open_files: int = 64
    output_bytes: int = 64 * 1024

    def problems(self) -> list[str]:
        """Every limit that is not a positive number, named with its value (an empty list where all are)."""
        found = [f"{name} must be a positive number, got {value!r}" for name, value in asdict(self).items()
                 if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0]
        if not found and self.memory_bytes < 64 * MB:
            found.append(f"memory_bytes must be at least {64 * MB} (the interpreter itself needs that much address "
                         f"space), got {self.memory_bytes}")
        if not found and self.open_files < 16:
            found.append(f"open_files must be at least 16 (the interpreter opens some), got {self.open_files}")
        return found

    def as_config(self) -> dict[str, Any]:
        return asdict(self)
