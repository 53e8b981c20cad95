"""One pass over the merged configuration that reports every problem at once, before anything is instantiated.

jsonargparse stops at the first bad key; a user fixing a config wants the whole list, including the checks that
span classes (``group_size`` against the advantage mode), which no single signature can express.
"""

from __future__ import annotations

import functools
import inspect
import pkgutil
import re
from collections.abc import Callable
from typing import Any

from jsonargparse import ArgumentParser

from lit_grpo.cli.command_line import CLASS_KEYS
from lit_grpo.cli.config_names import accepted_keys, did_you_mean, with_package
from lit_grpo.cli.strategy import strategy_problems
from lit_grpo.errors import InputError
from lit_grpo.policy.knob_groups import plain_arguments, regroup
from lit_grpo.policy.module import PolicyModule
from lit_grpo.policy.objective import base_evaluation_problems
from lit_grpo.policy.optimizers import lr_scheduler_entry
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.distributed import config_world_size
from lit_grpo.run.rules import TrainerFacts, cross_knob_problems, risk_decision_problems

RISK_CALLBACK = "lit_grpo.callbacks.risk.RiskThreshold"  # by name: only cli/command.py imports the callbacks
# weights_only: Lightning writes it into every run's config.yaml, which must come back as the resume command's --config
# beside the subcommands' own (subcommand_arguments: ckpt_path, weights_only, verbose, return_predictions)
TOP_LEVEL_KEYS = {"config", "seed_everything", "trainer", "model", "data", "metrics", "checkpoint"}
# LightningCLI's top-level sections for an automatic configure_optimizers, which lit-grpo's module replaces with its
# own arguments (the model is built in configure_model, after those sections would be instantiated over no parameters)
MODULE_ARGUMENTS = {
    "optimizer": "the optimizer is the module's argument here: --model.optimizer AdamW --model.optimizer.lr 1e-4",
    "lr_scheduler": ("the scheduler is the module's argument here: --model.lr_scheduler StepLR "
                     "--model.lr_scheduler.step_size 100"),
}
METRICS_CALLBACK = "lit_grpo.callbacks.metrics.RolloutMetrics"  # the ``metrics:`` section's class
CALLBACK_PACKAGES = ("lightning.pytorch.callbacks", "lit_grpo.callbacks")  # where a bare callback name is found


def subcommand_arguments() -> set[str]:
    """The arguments a subcommand takes beside the classes' sections: its Trainer method's, less what the command
    builds (the model, the data module, loaders)."""
    from lightning.pytorch import Trainer

    built = {"self", "model", "datamodule", "train_dataloaders", "val_dataloaders", "dataloaders"}
    return {name for method in (Trainer.fit, Trainer.validate, Trainer.test, Trainer.predict)
            for name in inspect.signature(method).parameters if name not in built}


def import_object(path: str) -> Any:
    """The object at a ``class_path`` (``package.module.Name``), as jsonargparse imports it: a dotted path only."""
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"expected a dotted import path, got {path!r}")
    return pkgutil.resolve_name(path)


def signature_defaults(cls: type) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.default is not inspect.Parameter.empty
    }


def required_arguments(cls: type | Callable) -> list[str]:
    """The arguments of a class (or function) that have no default."""
    target = cls.__init__ if isinstance(cls, type) else cls
    skip = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return [name for name, p in inspect.signature(target).parameters.items()
            if name != "self" and p.kind not in skip and p.default is inspect.Parameter.empty]


@functools.lru_cache(maxsize=64)
def arguments_parser(cls: type | Callable) -> ArgumentParser:
    """A parser of one class's (or function's) arguments; built once per class in a process (a test suite builds the
    command's check many times over), and only parsed with afterwards, which leaves it as it was."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls) if isinstance(cls, type) else parser.add_function_arguments(cls)
    return parser


def key_problems(section: str, cls: type | Callable, values: dict[str, Any]) -> dict[str, str]:
    """Unknown keys and wrongly typed values of one class's arguments, checked one key at a time (each beside the
    given required arguments, which a class's parser needs whatever key it checks)."""
    parser = arguments_parser(cls)
    missing = [name for name in required_arguments(cls) if name not in values]
    if missing:  # every key's parse would fail on them: report them alone (and a given key that looks like one)
        return {name: f"{section}.{name}: required, not given{did_you_mean(name, values).replace('did you mean', 'is it')}"
                for name in missing}
    required = required_arguments(cls)

    accepted = accepted_keys(cls)

    def problem(key: str, alongside: list[str]) -> str | None:
        if accepted is not None and key not in accepted:
            return f"{section}.{key}: unknown key{did_you_mean(key, accepted)}"
        try:
            parser.parse_object({**{k: values[k] for k in alongside if k != key}, key: values[key]}, defaults=False)
        except Exception as error:  # noqa: BLE001 - jsonargparse raises several types; we report its text
            detail = " ".join(str(error).split("\n")[1:]).strip() or str(error)
            if f"Option '{key}' is not accepted" in detail:  # a class taking **kwargs that jsonargparse refuses
                named = signature_defaults(cls) if isinstance(cls, type) else {}
                return f"{section}.{key}: unknown key{did_you_mean(key, named)}"
            inner = re.match(rf'Parser key "({key}\.[\w.]+)"', str(error))  # a group's field (model.kl.coef)
            return f"{section}.{inner.group(1) if inner else key}: {detail}"
        return None

    problems = {key: p for key in required if (p := problem(key, required)) is not None}
    sound = [key for key in required if key not in problems]
    problems.update({key: p for key in values if key not in required and (p := problem(key, sound)) is not None})
    return problems


def section_problems(config: dict[str, Any], trainer_cfg: dict[str, Any]) -> list[str]:
    """Keys one level down, checked as the top level is: ``data.engine``'s, each of ``trainer.callbacks``,
    ``trainer.logger``, ``trainer.strategy`` and ``trainer.plugins``, and the ``metrics:`` and ``checkpoint:``
    callback sections."""
    from lightning.pytorch import Callback
    from lightning.pytorch.callbacks import ModelCheckpoint

    data_cfg = config.get("data") if isinstance(config.get("data"), dict) else {}
    problems = class_path_problems("data.engine", with_package(data_cfg.get("engine"), ("lit_grpo.engines",)), object)
    callbacks = trainer_cfg.get("callbacks")
    for index, spec in enumerate(callbacks if isinstance(callbacks, list) else [callbacks] if callbacks else []):
        problems += class_path_problems(f"trainer.callbacks[{index}]", with_package(spec, CALLBACK_PACKAGES), Callback)
    for key, package in (("logger", "lightning.pytorch.loggers"), ("strategy", "lightning.pytorch.strategies"),
                         ("plugins", "lightning.pytorch.plugins")):
        given = trainer_cfg.get(key)
        for index, spec in enumerate(given if isinstance(given, list) else [given]):
            section = f"trainer.{key}[{index}]" if isinstance(given, list) else f"trainer.{key}"
            problems += class_path_problems(section, with_package(spec, (package,)), object)
    for name, cls in (("metrics", import_object(METRICS_CALLBACK)), ("checkpoint", ModelCheckpoint)):
        values = config.get(name)
        if isinstance(values, dict):
            problems += list(key_problems(name, cls, values).values())
        elif values is not None:
            problems.append(f"{name}: expected a mapping of {name}.* settings, got {values!r}")
    return problems


def class_path_problems(section: str, spec: Any, base: type) -> list[str]:
    """A ``{class_path, init_args}`` value: the class must import, subclass ``base`` and accept the init_args."""
    if isinstance(spec, str):
        spec = {"class_path": spec}
    if not isinstance(spec, dict) or "class_path" not in spec:
        return []
    try:
        cls = import_object(spec["class_path"])
    except Exception:  # noqa: BLE001
        return [f"{section}: cannot import class_path {spec['class_path']!r}"]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        return [f"{section}: {spec['class_path']!r} is not a subclass of {base.__module__}.{base.__name__}"]
    init_args = class_arguments(spec)
    unimportable = nested_import_problems(section, init_args)
    rest = {k: v for k, v in init_args.items() if k not in unimportable}
    return list(unimportable.values()) + list(key_problems(section, cls, rest).values())


def nested_import_problems(section: str, init_args: dict[str, Any]) -> dict[str, str]:
    """Arguments given as ``{class_path: ...}`` (a task's ``reward``, or a list of them): a class that does not
    import, or arguments it does not accept, reported plainly (``data.task.rewards[0].labl: unknown key``) instead
    of jsonargparse's union-type listing."""
    problems = {}
    for key, value in init_args.items():
        items = value if isinstance(value, list) else [value]
        for index, item in enumerate(items):
            if not (isinstance(item, dict) and isinstance(item.get("class_path"), str)):
                continue
            where = f"{section}.{key}[{index}]" if isinstance(value, list) else f"{section}.{key}"
            found = class_path_problems(where, item, object)
            if found:
                problems[key] = "; ".join(found)
    return problems


def config_problems(config: dict[str, Any]) -> list[str]:
    """Every problem of a merged config: keys, types, values, and the rules that span sections."""
    from lightning.pytorch import Trainer

    from lit_grpo.engines import HFEngine
    from lit_grpo.tasks import ArithmeticTask, Task

    accepted = TOP_LEVEL_KEYS | subcommand_arguments()
    problems = [f"{key}: {MODULE_ARGUMENTS[key]}" if key in MODULE_ARGUMENTS else
                f"{key}: unknown top-level key{did_you_mean(key, accepted)}" for key in config if key not in accepted]
    if config.get("weights_only") is False:  # a checkpoint is data: never unpickled into code
        problems.append("weights_only: false would unpickle the checkpoint, running whatever code it carries; "
                        "lit-grpo's checkpoints hold tensors and plain containers: leave it unset (or true)")
    sections = {key: config.get(key) or {} for key in ("model", "data", "trainer")}
    for key, value in sections.items():
        if not isinstance(value, dict):
            problems.append(f"{key}: expected a mapping of {key}.* settings, got {value!r}")
            sections[key] = {}
    model_cfg, data_cfg, trainer_cfg = (dict(sections[k]) for k in ("model", "data", "trainer"))
    problems += optimizer_problems(model_cfg.pop("optimizer", None))
    problems += lr_scheduler_problems(model_cfg.pop("lr_scheduler", None))
    model_bad = key_problems("model", PolicyModule, model_cfg)
    for key in {"class_path", "init_args"} & set(model_bad):  # data.task's nesting, which model: does not take
        model_bad[key] = (f"model.{key}: model: takes PolicyModule's settings directly (model.kl.coef, not "
                          "model.init_args.kl.coef)")
    data_bad = key_problems("data", RolloutDataModule, {k: v for k, v in data_cfg.items() if k not in ("task", "engine")})
    trainer_bad = key_problems("trainer", Trainer, {k: v for k, v in trainer_cfg.items() if k not in ("callbacks", "logger", "plugins", "strategy")})
    problems += list(model_bad.values()) + list(data_bad.values()) + list(trainer_bad.values())
    problems += class_path_problems("data.task", with_package(data_cfg.get("task"), ("lit_grpo.tasks",)), Task)
    problems += section_problems(config, trainer_cfg)
    # value checks see the defaults in place of values already reported, so each problem is reported once
    model_args = {**signature_defaults(PolicyModule), **without(model_cfg, model_bad)}
    data_args = {**signature_defaults(RolloutDataModule), **without(data_cfg, data_bad)}
    problems += [f"model.{p}" for p in PolicyModule.config_problems(model_args)]
    problems += [f"model.{p}" for p in base_evaluation_problems(model_args["evaluate_base"],
                                                                ckpt_path=config.get("ckpt_path"))]
    problems += [f"data.{p}" for p in RolloutDataModule.config_problems(data_args)]
    engine = named_class(data_cfg, "engine", HFEngine, "lit_grpo.engines")
    task = named_class(data_cfg, "task", ArithmeticTask, "lit_grpo.tasks")
    reload = trainer_cfg.get("reload_dataloaders_every_n_epochs")
    trainer = TrainerFacts(config_world_size(trainer_cfg), trainer_cfg.get("use_distributed_sampler") is True,
                           reload if isinstance(reload, int) else None)  # a value of another type: reported above
    task_args = class_arguments(data_cfg.get("task"))  # a tool task's max_turns against data.branching
    grouped = plain_arguments(regroup(model_args).arguments)  # the module's knobs in their groups, as it reads them
    problems += cross_knob_problems(grouped, data_args, engine, task, trainer, task_args,
                                    reward_classes(task_args.get("rewards")))
    problems += risk_callback_problems(trainer_cfg.get("callbacks"), task)
    problems += strategy_problems(trainer_cfg)  # whatever the world size: FSDP on one CPU process fails too
    max_epochs = trainer_cfg.get("max_epochs")
    if isinstance(max_epochs, int) and max_epochs < -1:
        problems.append(f"trainer.max_epochs: must be >= 0 (or -1 for no limit), got {max_epochs}")
    problems += trainer_value_problems(trainer_cfg)
    return problems


def risk_callback_problems(callbacks: Any, task: Any) -> list[str]:
    """``rules.risk_decision_problems`` for each ``RiskThreshold`` (or subclass) among ``trainer.callbacks``
    (``task``: the task's class, None when it does not import). The callback is known by name: only cli/command.py
    imports the callbacks."""
    from lit_grpo.tasks.episodes import names_answer_tokens

    problems = []
    for spec in callbacks if isinstance(callbacks, list) and task is not None else []:
        spec = with_package({"class_path": spec} if isinstance(spec, str) else spec, CALLBACK_PACKAGES)
        path = spec.get("class_path") if isinstance(spec, dict) else None
        try:
            cls = import_object(path) if isinstance(path, str) else None
        except Exception:  # noqa: BLE001 - reported when the callbacks are built
            cls = None
        names = {f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__} if isinstance(cls, type) else set()
        if RISK_CALLBACK in names:
            decision = class_arguments(spec).get("decision", "threshold")
            problems += risk_decision_problems(decision, task.__name__, names_answer_tokens(task))
    return problems


# trainer values Lightning accepts at construction that crash after the first rollouts (a division by zero) or
# silently corrupt training: (key, bad, what to give instead)
TRAINER_VALUES = (
    ("accumulate_grad_batches", lambda v: v < 1, "must be >= 1 (one optimizer step every N minibatches)"),
    ("check_val_every_n_epoch", lambda v: v < 1, "must be >= 1 (validate every N epochs), or null"),
    ("val_check_interval", lambda v: v <= 0, "must be > 0 (a fraction of an epoch, or a number of minibatches)"),
    ("gradient_clip_val", lambda v: v < 0, ("must be >= 0 (0 or null: no clipping; a negative bound would reverse "
                                            "every gradient)")),
)


def trainer_value_problems(trainer_cfg: dict[str, Any]) -> list[str]:
    """``TRAINER_VALUES`` checked on the numbers given (a value of the wrong type is reported by its type)."""
    problems = []
    for key, bad, rule in TRAINER_VALUES:
        value = trainer_cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and bad(value):
            problems.append(f"trainer.{key}: {rule}, got {value}")
    return problems


def optimizer_problems(spec: Any) -> list[str]:
    """``model.optimizer``: a torch optimizer that accepts its arguments, built once on a stand-in parameter so its
    own checks (a negative momentum, ...) speak before any work; lr must be positive (0 would train nothing)."""
    import torch

    args = class_arguments(spec)
    if isinstance(args.get("lr"), (int, float)) and not args["lr"] > 0:
        return [f"model.optimizer.lr: must be > 0, got {args['lr']}"]
    return built_class_problems("model.optimizer", "optimizer", spec, "torch.optim", "AdamW",
                                lambda cls: cls([torch.nn.Parameter(torch.zeros(1))], **args))


def lr_scheduler_problems(spec: Any) -> list[str]:
    """``model.lr_scheduler``: a scheduler that accepts its arguments, built once on a stand-in optimizer and made
    into the module's scheduler entry (``lr_scheduler_entry``: a ReduceLROnPlateau needs a monitored metric), so a
    missing ``total_steps`` or an unmonitored plateau speaks before any work."""
    import torch

    args = class_arguments(spec)
    stand_in = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    return built_class_problems("model.lr_scheduler", "scheduler", spec, "torch.optim.lr_scheduler", "StepLR",
                                lambda cls: lr_scheduler_entry(cls(stand_in, **args)))


def class_arguments(spec: Any) -> dict[str, Any]:
    """A ``{class_path, init_args}`` value's arguments (jsonargparse also takes them beside ``class_path``)."""
    if not isinstance(spec, dict):
        return {}
    return {**{k: v for k, v in spec.items() if k not in CLASS_KEYS}, **(spec.get("init_args") or {})}


def built_class_problems(section: str, kind: str, spec: Any, package: str, example: str,
                         build: Callable[[type], Any]) -> list[str]:
    """A class given by name (read in ``package``) or import path that imports, and that ``build`` makes without an
    error; the error names the class and the arguments given (those that differ from its defaults)."""
    if spec is None:
        return []
    spec = {"class_path": spec} if isinstance(spec, str) else spec
    if not isinstance(spec, dict) or not isinstance(spec.get("class_path"), str):
        return [f"{section}: name the {kind} class too, e.g. --{section} {example} --{section}.<argument> <value> (or "
                f"class_path: {package}.{example} with init_args in YAML)"]
    name = spec["class_path"]
    try:
        cls = import_object(name if "." in name else f"{package}.{name}")
    except Exception:  # noqa: BLE001
        return [f"{section}: cannot import {name!r}"]
    accepted = inspect.signature(cls).parameters
    unknown = [key for key in class_arguments(spec) if key not in accepted]
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return [f"{section}.{key}: unknown key{did_you_mean(key, list(accepted)[1:])}" for key in unknown]
    try:
        build(cls)
    except InputError as error:  # a rule of ours, complete in itself
        return [str(error)]
    except Exception as error:  # noqa: BLE001 - the class's own message names the bad argument
        given = ", ".join(f"{k}={v!r}" for k, v in class_arguments(spec).items() if not is_default(cls, k, v))
        return [f"{section}: {name.rsplit('.', 1)[-1]}({given}): {error}"]
    return []


def is_default(cls: type, name: str, value: Any) -> bool:
    """Whether ``value`` is ``cls``'s own default for argument ``name`` (a tuple default equals the list of its
    items, as YAML and jsonargparse give it)."""
    default = signature_defaults(cls).get(name, inspect.Parameter.empty)
    both_sequences = isinstance(value, (list, tuple)) and isinstance(default, (list, tuple))
    return (list(value) == list(default)) if both_sequences else (value is default or value == default)


def reward_classes(rewards: Any) -> list[Any] | None:
    """The classes of a task's configured ``rewards`` (class paths, ``{class_path, init_args}`` as a mapping or as
    jsonargparse's ``Namespace`` once the task's arguments are checked); None when none is configured (the built
    task's own are checked then); functions and what does not import are left out (the task names them when built)."""
    from jsonargparse import Namespace

    if not isinstance(rewards, list):
        return None
    paths = [r.get("class_path") if isinstance(r, (dict, Namespace)) else r for r in rewards]
    found = []
    for path in paths:
        try:
            found.append(import_object(path))
        except Exception:  # noqa: BLE001 - a file's function, a typo: refused by the task itself
            continue
    return [cls for cls in found if isinstance(cls, type)]


def named_class(data_cfg: dict[str, Any], key: str, default: type, package: str) -> Any:
    """The class ``data.<key>`` names, a bare name read in ``package`` (``default`` when it names none; ``None`` if it
    cannot be imported, which ``class_path_problems`` or instantiation reports)."""
    spec = data_cfg.get(key)
    path = spec.get("class_path") if isinstance(spec, dict) else spec
    if not isinstance(path, str):
        return default
    try:
        return import_object(path if "." in path else f"{package}.{path}")
    except Exception:  # noqa: BLE001
        return None


def without(values: dict[str, Any], reported: dict[str, str]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if key not in reported}
