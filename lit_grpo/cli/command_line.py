"""The command line and its ``--config`` files read into one plain mapping, as jsonargparse reads them, for the
configuration check (``config_check``) when jsonargparse itself refuses the input: it stops at the first bad key,
and a user fixing a config wants the whole list.

Only the forms jsonargparse documents are read, each as it means them (Lightning's CLI documentation, "Trainer
Callbacks and arguments with class type"):
- ``--config FILE`` / ``-c FILE``, merged in order with the dotted options around them;
- ``--a.b value`` and ``--a.b=value``, a value read by jsonargparse's YAML loader (a number, a list, a JSON dict);
- a class by name or import path (``--model.optimizer AdamW``) followed by its arguments (``--model.optimizer.lr 1``,
  or ``--model.optimizer.init_args.lr 1``): the arguments go under the class's ``init_args``;
- ``--trainer.callbacks+=X`` appends to the list (a list value extends it), and the arguments that follow
  (``--trainer.callbacks.patience 5``) go to the class appended last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from jsonargparse import get_loader

from lit_grpo.errors import InputError

SUBCOMMANDS = ("fit", "validate", "test", "predict")
CLASS_KEYS = ("class_path", "init_args", "dict_kwargs")  # a class's own keys; any other key below it is an argument


def merged_config(args: list[str]) -> dict[str, Any] | None:
    """The subcommand's config from its ``--config`` files and ``--a.b=value`` overrides; None for ``--help``."""
    if not args or any(a in ("-h", "--help") or a.startswith("--print_config") or a.endswith(".help") for a in args):
        return None
    if args[0] in SUBCOMMANDS:
        args = args[1:]
    elif not args[0].startswith("-"):
        return None  # a subcommand jsonargparse will reject with its own message
    merged: dict[str, Any] = {}
    for key, value in split_options(args):
        if key in ("config", "c"):
            deep_merge(merged, read_config_file(value))
        else:
            apply_option(merged, key, option_value(value) if value is not None else True)
    return merged


def check_config_files(args: list[str]) -> None:
    """The ``--config`` files among ``args`` that jsonargparse read: ``InputError`` naming one that sets a key twice
    (a YAML loader keeps the last silently)."""
    for key, value in split_options(args):
        if key in ("config", "c") and value is not None and Path(value).is_file():
            read_config_file(value)


def read_config_file(name: str | None) -> dict[str, Any]:
    """A ``--config`` file's settings (or the mapping given in its place, as jsonargparse takes a YAML or JSON text
    there); ``InputError`` naming the file when it is missing, not YAML, has a key twice, or is not a mapping of
    sections."""
    path = Path(name or "")
    if not path.is_file() and not isinstance(inline_mapping(name), dict):
        raise InputError(f"--config {name!r}: {'a directory' if path.is_dir() else 'no such file'}; give a YAML file")
    try:
        text = path.read_text(encoding="utf-8") if path.is_file() else str(name)
        duplicates = duplicate_keys(text)
        settings = load_yaml(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        mark, problem = getattr(error, "problem_mark", None), getattr(error, "problem", None)
        detail = (f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None and problem
                  else " ".join(str(error).split()))
        raise InputError(f"--config {name!r} cannot be read as YAML: {detail}") from None
    if duplicates:
        raise InputError(f"--config {name!r} sets {', '.join(duplicates)} twice; keep one")
    if settings is None:
        raise InputError(f"--config {name!r} is empty; give sections such as model:, data:, trainer:")
    if not isinstance(settings, dict):
        kind = {"list": "a list", "int": "a number", "float": "a number", "str": "a string"}.get(
            type(settings).__name__, type(settings).__name__)
        raise InputError(f"--config {name!r} holds {kind}, not a mapping of sections (model:, data:, trainer:, ...)")
    return settings


def option_value(text: str) -> Any:
    """A command-line value as jsonargparse takes it: YAML where it is YAML, else the text itself (``[1``)."""
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text


def inline_mapping(text: str | None) -> Any:
    """``text`` read as YAML when it holds a mapping (``--config '{"trainer": {"max_epochs": 1}}'``), else None."""
    try:
        return load_yaml(text) if text and ("{" in text or ":" in text) else None
    except yaml.YAMLError:
        return None


def duplicate_keys(text: str) -> list[str]:
    """Dotted keys set twice in one mapping of a YAML text (YAML loaders keep the last silently), with lines."""
    found: list[str] = []

    def walk(node: Any, path: list[str]) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                name = str(key.value)
                if name in seen:
                    found.append(f"{'.'.join([*path, name])} (line {key.start_mark.line + 1})")
                seen.add(name)
                walk(value, [*path, name])
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, path)

    walk(yaml.compose(text, Loader=yaml.SafeLoader), [])
    return found


def load_yaml(text: str) -> Any:
    """YAML as jsonargparse reads it (``1e-3`` is a float there, a string to plain PyYAML): its current loader."""
    return get_loader("yaml")(text)


def apply_option(config: dict[str, Any], key: str, value: Any) -> None:
    """One ``--key=value`` into ``config``, as jsonargparse applies it: ``a.b`` sets ``config[a][b]``; below a class
    (``{"class_path": ...}``, or a class given by name) an argument goes under ``init_args``; below a list it goes to
    the list's last item; ``a.b+`` appends ``value`` to the list at ``a.b`` (a list value extends it)."""
    *path, last = key.split(".")
    append = last.endswith("+")
    last = last.removesuffix("+")
    node = config
    for part in path:
        node = child_mapping(node, part)
    node = arguments_of(node, last)
    if append:
        given = node.get(last)
        items = given if isinstance(given, list) else [] if given is None else [given]
        node[last] = [*items, *(value if isinstance(value, list) else [value])]
    else:
        node[last] = value


def arguments_of(node: dict[str, Any], key: str) -> dict[str, Any]:
    """Where ``key`` is set below ``node``: in its ``init_args`` where ``node`` is a class and ``key`` is an
    argument of it, else in ``node`` itself."""
    if "class_path" not in node or key in CLASS_KEYS:
        return node
    if not isinstance(node.get("init_args"), dict):
        node["init_args"] = {}
    return node["init_args"]


def child_mapping(node: dict[str, Any], key: str) -> dict[str, Any]:
    """The mapping an option's next key goes into: ``node[key]`` made a mapping (a class name becomes
    ``{"class_path": name}``; a list of classes gives its last item, the one appended last)."""
    node = arguments_of(node, key)
    child = node.get(key)
    if isinstance(child, list) and child and isinstance(child[-1], (str, dict)):
        if isinstance(child[-1], str):
            child[-1] = {"class_path": child[-1]}
        return child[-1]
    if isinstance(child, str):
        child = {"class_path": child}
    elif not isinstance(child, dict):
        child = {}
    node[key] = child
    return child


def is_option(arg: str) -> bool:
    """``--key`` or a short flag such as ``-c``; ``-0.25`` is a value."""
    return arg.startswith("--") or (len(arg) == 2 and arg[0] == "-" and arg[1].isalpha())


def split_options(args: list[str]) -> list[tuple[str, str | None]]:
    """``["--a=1", "--b", "2", "--flag", "-c", "x"]`` -> ``[("a", "1"), ("b", "2"), ("flag", None), ("c", "x")]``."""
    pairs: list[tuple[str, str | None]] = []
    index = 0
    while index < len(args):
        key, sep, value = args[index].lstrip("-").partition("=")
        if not sep and index + 1 < len(args) and not is_option(args[index + 1]):
            value, index = args[index + 1], index + 1
        pairs.append((key, value if (sep or value) else None))
        index += 1
    return pairs


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value
