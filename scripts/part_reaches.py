"""Undeclared reaches between design §1's parts: every attribute read or write on an object that belongs to another
part must go through what that part declares (a ``Protocol``, its class's own members, Lightning's public API).

``lint-imports`` keeps the folders' imports one way; this keeps what crosses them declared. ``.venv/bin/python
scripts/part_reaches.py`` prints each reach as ``file:line: read|write expr.attr (why)`` and exits 1 if any.

An object is another part's when it is, in a function:

* a parameter annotated with a class of another part (``task: Task`` in the rollout part): its class's members;
* a parameter or variable named for a Lightning role (``trainer``, ``pl_module``, ``datamodule``, ...) and typed
  ``Any``, a Lightning base class or nothing, or anything reached through ``trainer.datamodule`` /
  ``trainer.lightning_module`` (``self.trainer`` included): the Lightning base class's public API only;
* a parameter named ``engine`` or ``task`` typed ``Any`` or nothing: nothing at all.

``isinstance(name, Contract)`` anywhere in the function adds ``Contract``'s members for that name (the narrowing a
caller writes before using a ``Protocol``). ``getattr``/``hasattr``/``setattr``/``delattr`` with a literal name are
read as the attribute; with a computed name on another part's object they are a reach whatever the name. Private
names (``_x``) of another part are never declared.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "lit_grpo", ROOT / "callbacks")
ROLE_OF_NAME = {"trainer": "trainer", "pl_module": "module", "lightning_module": "module", "module": "module",
                "datamodule": "datamodule", "data_module": "datamodule", "data": "datamodule",
                "engine": "engine", "task": "task", "scorer": "scorer", "buffer": "buffer", "episode": "episode",
                "outcome": "outcome", "node": "node", "labels": "labels", "head": "head", "risk": "risk"}
# Not parts, so not here: a user's tool environment (TRL's contract: its class's public methods are its tools) and
# raw configuration values (a YAML's strings and mappings, checked by cli/config_check.py).
PINNED_PRIVATE = frozenset({"_accelerator_connector"})  # tests/test_private_apis.py's inventory pins each
THROUGH_TRAINER = {"datamodule": "datamodule", "lightning_module": "module"}
# what a LightningModule, a DataModule or a LightningCLI holds of the others
SELF_ROLES = {"trainer": "trainer", "_trainer": "trainer", "datamodule": "datamodule"}
ATTRIBUTE_FUNCTIONS = {"getattr": "read", "hasattr": "read", "setattr": "write", "delattr": "write"}


class Reach(NamedTuple):
    path: str
    line: int
    kind: str  # read | write
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind} {self.text} ({self.why})"


def part_of_path(path: Path) -> str:
    """Design §1's part a source file belongs to: its folder under ``lit_grpo/`` (``callbacks/`` its own), or the
    top-level module's name."""
    relative = path.resolve().relative_to(ROOT)
    if relative.parts[0] == "callbacks":
        return "callbacks"
    return relative.parts[1] if len(relative.parts) > 2 else relative.stem


def part_of_class(cls: type) -> str | None:
    """The part of a class defined in the package (``lit_grpo.<part>....``), None for any other."""
    names = cls.__module__.split(".")
    if names[0] != "lit_grpo":
        return None
    return names[1] if len(names) > 1 else "__init__"


@cache
def lightning_api(role: str) -> frozenset[str]:
    """The public members of the Lightning class a role stands for, instance attributes included."""
    import lightning.pytorch as pl

    instance = {"trainer": lambda: pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                              enable_model_summary=False),
                "module": pl.LightningModule, "datamodule": pl.LightningDataModule}.get(role)
    if instance is None:
        return frozenset()
    return frozenset(name for name in dir(instance()) if not name.startswith("_"))


@cache
def declared_members(cls: type) -> frozenset[str]:
    """What a class declares: its members and annotated fields through its MRO, the public attributes its own
    methods assign on ``self``, and Lightning's API where it is a Lightning class."""
    import lightning.pytorch as pl

    names = set(dir(cls))
    for klass in cls.__mro__:
        names.update(vars(klass).get("__annotations__", {}))
        if dataclasses.is_dataclass(klass):
            names.update(field.name for field in dataclasses.fields(klass))
        names.update(self_assignments(klass))
    for base, role in ((pl.Trainer, "trainer"), (pl.LightningModule, "module"),
                       (pl.LightningDataModule, "datamodule")):
        if issubclass(cls, base):
            names |= lightning_api(role)
    return frozenset(name for name in names if not name.startswith("_"))


def self_assignments(cls: type) -> set[str]:
    """Attributes the class's own source assigns on ``self`` (``self.x = ...``)."""
    try:
        import inspect

        tree = ast.parse(inspect.getsource(cls).lstrip())  # a nested class's source is indented
    except (OSError, TypeError, SyntaxError):
        return set()
    assigned = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}
    buffers = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
               and dotted(node.func) == "self.register_buffer" and node.args and isinstance(node.args[0], ast.Constant)}
    return assigned | buffers


class Foreign(NamedTuple):
    """What is declared of an object of another part, and what it is, for the message."""

    allowed: frozenset[str]
    what: str


class FileReaches(ast.NodeVisitor):
    """The reaches of one source file."""

    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path, self.part = path, part_of_path(path)
        self.imports = imported_names(tree) | defined_names(tree, module_name(path))
        self.found: list[Reach] = []
        self.scopes: list[dict[str, Foreign | None]] = [{}]

    # --- what a name or an expression is ------------------------------------------------------------------------
    def resolve(self, node: ast.expr | None) -> list[Any]:
        """The objects an annotation names (``A | None``, ``Optional[A]``, ``A`` are each ``[A]``); ``Any`` is
        ``typing.Any``; what cannot be resolved is left out."""
        if node is None:
            return []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.resolve(node.left) + self.resolve(node.right)
        if isinstance(node, ast.Subscript):
            return self.resolve(node.slice) if dotted(node.value) in ("Optional", "typing.Optional") else []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.resolve(ast.parse(node.value, mode="eval").body)
        name = dotted(node)
        if name is None:
            return []
        head, _, rest = name.partition(".")
        target = self.imports.get(head)
        if target is None:
            return []
        value = load(target)
        for attribute in filter(None, rest.split(".")):
            value = getattr(value, attribute, None)
        return [] if value is None else [value]

    def foreign_of_annotation(self, name: str, annotation: ast.expr | None) -> Foreign | None:
        types = self.resolve(annotation)
        role = ROLE_OF_NAME.get(name)
        classes = [t for t in types if isinstance(t, type) and t is not Any]  # Any is a class since 3.11
        package = [c for c in classes if part_of_class(c) is not None]
        others = [c for c in package if part_of_class(c) != self.part]
        if others:  # of a union, what every one of the package's classes declares
            return Foreign(frozenset.intersection(*map(declared_members, package)), f"a {others[0].__name__}")
        if package or any(not lightning_base(c) for c in classes):
            return None  # its own part's or a library's object
        untyped = annotation is None or any(t is Any for t in types) or any(lightning_base(c) for c in classes)
        if role is not None and untyped:
            return Foreign(lightning_api(role), f"{name}, typed {ast.unparse(annotation) if annotation else 'nothing'}")
        return None

    def foreign(self, node: ast.expr) -> Foreign | None:
        key = dotted(node)  # a name, or an attribute chain narrowed by isinstance (``self.datamodule``)
        for scope in reversed(self.scopes):
            if key is not None and key in scope:
                return scope[key]
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in SELF_ROLES:
                return Foreign(lightning_api(SELF_ROLES[node.attr]), f"self.{node.attr}")
            owner = self.foreign(node.value)
            if owner is not None and owner.what.startswith(("trainer", "self.trainer", "self._trainer")) and node.attr in THROUGH_TRAINER:
                return Foreign(lightning_api(THROUGH_TRAINER[node.attr]), f"trainer.{node.attr}")
        return None

    # --- scopes -------------------------------------------------------------------------------------------------
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        scope: dict[str, Foreign | None] = {}
        arguments = node.args
        for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs):
            scope[argument.arg] = self.foreign_of_annotation(argument.arg, argument.annotation)
        self.scopes.append(scope)
        for statement in node.body:  # assignments from trainer.datamodule and the like, in order
            self.bind_assignments(statement, scope)
        self.narrow(node, scope)
        for statement in node.body:
            self.visit(statement)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def bind_assignments(self, statement: ast.stmt, scope: dict[str, Foreign | None]) -> None:
        for node in ast.walk(statement):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # typed as a parameter is
                scope.setdefault(node.target.id, self.foreign_of_annotation(node.target.id, node.annotation))
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        scope.setdefault(target.id, self.foreign(node.value) or self.via_getattr(node.value))

    def via_getattr(self, node: ast.expr) -> Foreign | None:
        """``getattr(trainer, "datamodule", None)``: what the attribute would be."""
        if isinstance(node, ast.Call) and dotted(node.func) == "getattr" and len(node.args) >= 2:
            attribute = node.args[1]
            if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                return self.foreign(ast.Attribute(value=node.args[0], attr=attribute.value, ctx=ast.Load()))
        return None

    def narrow(self, function: ast.AST, scope: dict[str, Foreign | None]) -> None:
        """``isinstance(x, C)`` in the function: ``x`` may use what ``C`` declares."""
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and dotted(node.func) == "isinstance" and len(node.args) == 2:
                subject = node.args[0]
                current = self.foreign(subject)
                if current is None:
                    continue
                options = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                classes = [c for option in options for c in self.resolve(option) if isinstance(c, type)]
                added = frozenset().union(*map(declared_members, classes)) if classes else frozenset()
                if dotted(subject) is not None:
                    scope[dotted(subject)] = Foreign(current.allowed | added, current.what)

    # --- the checks ---------------------------------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = self.foreign(node.value)
        if owner is not None:
            kind = "read" if isinstance(node.ctx, ast.Load) else "write"
            self.check(node, owner, node.attr, kind, ast.unparse(node))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        kind = ATTRIBUTE_FUNCTIONS.get(dotted(node.func) or "")
        if kind is not None and node.args:
            owner = self.foreign(node.args[0])
            if owner is not None:
                attribute = node.args[1] if len(node.args) > 1 else None
                if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str):
                    self.check(node, owner, attribute.value, kind, ast.unparse(node))
                else:
                    self.report(node, kind, ast.unparse(node), f"a computed attribute of {owner.what}")
        self.generic_visit(node)

    def check(self, node: ast.AST, owner: Foreign, attribute: str, kind: str, text: str) -> None:
        if attribute in PINNED_PRIVATE or (attribute.startswith("__") and attribute.endswith("__")):
            return  # a pinned private API of Lightning's; a type's own name or class
        if attribute.startswith("_") or attribute not in owner.allowed:
            self.report(node, kind, text, f"{attribute} is not declared by {owner.what}")

    def report(self, node: ast.AST, kind: str, text: str, why: str) -> None:
        self.found.append(Reach(str(self.path.relative_to(ROOT)), node.lineno, kind, text, why))


def lightning_base(cls: type) -> bool:
    import lightning.pytorch as pl

    return cls in (pl.Trainer, pl.LightningModule, pl.LightningDataModule)


def module_name(path: Path) -> str:
    """The dotted name a source file imports as (``callbacks/x.py`` is ``lit_grpo.callbacks.x``)."""
    parts = list(path.resolve().relative_to(ROOT).with_suffix("").parts)
    parts = ["lit_grpo", *parts] if parts[0] == "callbacks" else parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def defined_names(tree: ast.Module, module: str) -> dict[str, str]:
    """The classes a file defines at its top level, by their dotted names."""
    return {node.name: f"{module}.{node.name}" for node in tree.body if isinstance(node, ast.ClassDef)}


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Each name the file imports (anywhere, ``TYPE_CHECKING`` blocks included) -> what it stands for, dotted."""
    names = {"Any": "typing.Any"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
    return names


@cache
def load(dotted_name: str) -> Any:
    """The object ``a.b.c`` names: the longest importable module, then attributes; None if none."""
    parts = dotted_name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute, None)
        return value
    return None


def reaches_in(path: Path, source: str | None = None) -> list[Reach]:
    source = path.read_text() if source is None else source
    checker = FileReaches(path, ast.parse(source))
    checker.visit(ast.parse(source))
    return checker.found


def all_reaches() -> Iterator[Reach]:
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            yield from reaches_in(path)


def main() -> int:
    found = list(all_reaches())
    for reach in found:
        print(reach)
    print(f"{len(found)} undeclared reaches")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
