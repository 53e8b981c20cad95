"""``PythonSandbox``: a TRL environment whose one tool, ``python``, runs the model's code in the sandbox
(docs/guide.md#a-python-sandbox). Named in YAML like any environment::

    environment: lit_grpo.sandbox.PythonSandbox

Its settings are class attributes, so a subclass in the user's module is the whole configuration (``limits``,
``isolation``, ``interpreter``, ``url`` of a remote service). It declares ``bounds_own_calls``: the tool kit then keeps
it in the training process and the tool timeout does not apply to its calls (each is bounded by ``limits``).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from typing import Literal

from lit_grpo.errors import InputError
from lit_grpo.sandbox.limits import Limits
from lit_grpo.sandbox.remote import run_remote
from lit_grpo.sandbox.runner import Outcome, isolation_problem, run_code

_scratch_left: set[str] = set()  # every scratch directory not yet removed, removed at exit at the latest


@atexit.register
def _remove_every_scratch() -> None:
    for path in list(_scratch_left):
        _remove(path)


def _remove(path: str | None) -> None:
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)
        _scratch_left.discard(path)


class CodeFailed(RuntimeError):
    """The code did not end well (an exception, a limit, a signal): one counted tool failure, its text the model's."""


class PythonSandbox:
    """A ``python`` tool (TRL's ``environment_factory`` contract): each call runs the code in a fresh child process
    with ``limits``, in a scratch directory of the rollout's own (made at ``reset``, removed at the next ``reset``,
    when the instance goes, or at exit): files persist between a rollout's calls, variables do not.

    Class attributes (set them in a subclass):
        limits: the ``Limits`` of each call.
        isolation: ``"auto"`` (namespaces where the kernel allows them, else limits only, with a warning naming the
            kernel's reason), ``"namespaces"`` (refused where the kernel does not allow them) or ``"none"``.
        interpreter: the Python that runs the code (None: this one).
        url: a SandboxFusion-style ``/run_code`` endpoint; the calls go there instead (``headers`` sent with each).
    """

    bounds_own_calls = True
    limits: Limits = Limits()
    isolation: Literal["auto", "namespaces", "none"] = "auto"
    interpreter: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = {}

    def __init__(self) -> None:
        problems = self.limits.problems()
        if self.isolation not in ("auto", "namespaces", "none"):
            problems.append(f"isolation must be 'auto', 'namespaces' or 'none', got {self.isolation!r}")
        if problems:
            raise InputError(f"{type(self).__name__}: " + "; ".join(problems))
        self._scratch: str | None = None
        self._mode: Literal["namespaces", "none"] = "none"
        if self.url is None and self.isolation != "none":
            problem = isolation_problem(self.interpreter)
            if problem is not None and self.isolation == "namespaces":
                raise InputError(f"{type(self).__name__}: isolation 'namespaces' is not possible here: {problem} "
                                 "(see docs/guide.md#a-python-sandbox; 'auto' runs with limits only)")
            if problem is not None:
                warnings.warn(f"{type(self).__name__} runs without namespaces ({problem}): no network, filesystem "
                              "or process isolation, limits only (docs/guide.md#a-python-sandbox)", stacklevel=2)
            self._mode = "namespaces" if problem is None else "none"

    def reset(self, **row: object) -> None:
        """A new rollout: a new, empty scratch directory (the previous one removed)."""
        _remove(self._scratch)
        self._scratch = None

    def python(self, code: str) -> str:
        """Run a Python program in a fresh process and return what it printed. Files it writes in its working
        directory stay for the next calls; variables do not.

        Args:
            code: The whole Python program to run. Print what you want to see.
        """
        outcome = self._run(code)
        if outcome.failed:
            shown = f"; its output:\n{outcome.output}" if outcome.output else ""
            raise CodeFailed(f"the code {outcome.detail}{shown}")
        return outcome.output

    def _run(self, code: str) -> Outcome:
        if self.url is not None:
            return run_remote(self.url, code, self.limits, self.headers)
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="lit-grpo-sandbox-")
            _scratch_left.add(self._scratch)
        return run_code(code, self._scratch, self.limits, self._mode, self.interpreter)

    def __del__(self) -> None:
        _remove(getattr(self, "_scratch", None))
