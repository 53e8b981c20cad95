"""Names in a configuration: the keys a class accepts, the known name closest to a misspelt one, and a bare class
name's dotted path (helpers of ``lit_grpo.cli.config_check``)."""

from __future__ import annotations

import difflib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any


def accepted_keys(cls: type | Callable) -> list[str] | None:
    """The argument names a class (or function) accepts; None when it takes ``**kwargs`` (any name may do)."""
    parameters = inspect.signature(cls.__init__ if isinstance(cls, type) else cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.name != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]


def did_you_mean(key: str, known: Any) -> str:
    """``; did you mean X?`` for the known name closest to a misspelt ``key`` (none when nothing is close)."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def with_package(spec: Any, packages: tuple[str, ...]) -> Any:
    """A ``class_path`` spec whose bare class name (``HFEngine``) is given its package's dotted path, the first of
    ``packages`` that has it (as jsonargparse resolves it); other specs as given."""
    path = spec if isinstance(spec, str) else spec.get("class_path") if isinstance(spec, dict) else None
    if not isinstance(path, str) or "." in path:
        return spec
    for package in packages:
        try:
            found = pkgutil.resolve_name(f"{package}.{path}")
        except Exception:  # noqa: BLE001 - not in this package
            continue
        if not isinstance(found, type):  # a module of that name (``ddp``): a registry alias, not a class
            continue
        full = f"{package}.{path}"
        return {**spec, "class_path": full} if isinstance(spec, dict) else full
    return None  # unknown to us: jsonargparse reports it
