"""Every configuration rule in one place: each knob's choices (read off the ``Literal`` types of the typed
``__init__`` signatures, where they are spelled once) and every rule that spans knobs, in one registry
(``cross_knob_problems``), run before any weights load (``lit_grpo.cli.config_check``, from the command line) and again
in ``RolloutDataModule.setup`` (the Python API), each with one wording. Each knob's own range is checked where it is
read (``PolicyModule.config_problems``, ``RolloutDataModule.config_problems``), and so are the rules among one part's
own knobs (the module's: ``lit_grpo.policy.knob_rules``, read off the loss variants' table); a rule that reads two
knobs or more of different parts (the module, the data, the trainer, the task, the engine or a callback) lives here
only.

Which features work with which rollout kind is data (``FEATURES``). Grouped rollouts (G completions of one prompt)
carry every loss and sampling feature; tree and chain rollouts (multi-round episodes scored by an environment) carry
tree-relative advantages and the risk head. A feature set with a rollout kind that does not implement it was silently
ignored or failed after the first generation; here it is refused by name. ``tests/test_combinations.py`` runs or
refuses every row.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from lit_grpo.run.task_rules import reward_timeout_problems

# run/ sits below every part it has rules for (pyproject.toml's import contracts): what the rules need to know of the
# rollout kinds, the engines and the tasks is spelled here, and the parts above import it from here
RolloutKind = Literal["grouped", "tree", "chains"]  # how an epoch's rollouts are drawn (RolloutDataModule.rollout)
ROLLOUTS = typing.get_args(RolloutKind)
# an engine class that samples from its own copy of the pushed weights says so, as VLLMEngine does (data.max_staleness)
SNAPSHOT_ATTRIBUTE = "samples_from_copy"


@runtime_checkable
class SamplesFromCopy(Protocol):
    """An engine (instance or class) that declares whether it samples from its own copy of the pushed weights."""

    samples_from_copy: bool


MISSING = object()  # a knob not among the arguments given
TREE_BRANCHING = (4, 2, 2)  # data.branching's default under rollout 'tree': 16 leaves over three rounds


@runtime_checkable
class DeclaresRounds(Protocol):
    """A multi-round task (instance or class) that says how many rounds it runs at most (None: no limit, chains
    only)."""

    max_rounds: int | None


@runtime_checkable
class MultiRound(Protocol):
    """A task that tree and chain rollouts can grow (``tasks.MultiRoundTask``): the environment's turn per round."""

    def turn(self, prompt_record: Any, episode: Any, round_index: int, segment_text: str, tokenizer: Any,
             truncated: bool, segment_ids: Any = (), context_ids: Any = ()) -> Any: ...


@runtime_checkable
class StepsAlone(Protocol):
    """A multi-round task whose turn reads the record, the round and the segment alone (a game, ``tasks.GameTask``):
    a grouped rollout scores each completion as its first round. A task whose turns need their episode's state (a
    tool task's conversation and environment) runs over turns only."""

    def step(self, prompt_record: Any, round_index: int, segment_text: str) -> Any: ...


@runtime_checkable
class NamesDeferTokens(Protocol):
    """A multi-round task that says which first tokens start a defer (a question): the only ones the risk rule allows
    where it forces a defer."""

    def defer_token_ids(self, tokenizer: Any) -> list[int]: ...


@runtime_checkable
class NamesAnswerTokens(Protocol):
    """A multi-round task that says which first tokens start an answer: the only ones the value rule allows where it
    forces an answer."""

    def answer_token_ids(self, tokenizer: Any) -> list[int]: ...


@runtime_checkable
class NamesFirstTokens(NamesDeferTokens, NamesAnswerTokens, Protocol):
    """A multi-round task that names both (the question games): what the risk rule reads of it."""


@dataclass(frozen=True)
class Feature:
    knob: str  # "model.<arg>", "model.<group>.<field>" (the module's knob groups) or "data.<arg>"
    is_on: Callable[[Any], bool]  # whether the knob's value turns the feature on
    rollouts: tuple[str, ...]  # the rollout kinds that implement it
    why: str  # what the other kinds lack


FEATURES: tuple[Feature, ...] = (
    Feature("model.loss_variant", lambda v: v == "dpo", ("grouped",),
            "online DPO pairs the best and worst completion of one prompt's group"),
    Feature("model.advantage_mode", lambda v: v == "gae", ("grouped", "chains"),
            "PPO's value head and GAE run along one trajectory per row or chain; a tree's branches share their "
            "ancestors, and trees use tree-relative advantages"),
    Feature("model.tree.std_scope", lambda v: v != "tree", ("tree",),
            "only a tree has sibling groups and a tree-wide std to divide by or not (chains choose with "
            "model.advantage_mode: grpo divides by the group's std, drgrpo and centered do not)"),
    Feature("model.tree.flat_groups", lambda v: v != "count", ("tree",),
            "only a tree has sibling groups below the prompt (a grouped rollout leaves its flat prompt groups out "
            "with data.dynamic_sampling)"),
    Feature("model.turn_credit", lambda v: v != "episode", ("chains",),
            "only chains give each turn a row of its own among the group's episodes (a tree backs each node's reward "
            "up its branches: Q = r + V; a grouped completion has one turn)"),
    Feature("model.kl.applied_to", lambda v: v == "reward", ("grouped",),
            "the KL penalty is folded into the reward of a single-round completion"),
    Feature("model.sampler_correction", lambda v: v is not None, ("grouped",),
            "the sampler correction weighs grouped rollouts' tokens by their sampler log-probs"),
    Feature("data.dynamic_sampling", bool, ("grouped",), "dynamic sampling redraws prompts whose group is flat"),
    Feature("data.mask_truncated", bool, ("grouped",), "overlong filtering masks grouped completions"),
    Feature("data.overlong_cache", lambda v: v is not None, ("grouped",),
            "the overlong penalty is added to a single-round completion's reward"),
    Feature("data.reward_timeout", lambda v: v is not None, ("grouped",),
            "reward isolation wraps the task's reward, which tree and chain rollouts do not call (their environment "
            "scores each round)"),
    Feature("model.risk", lambda v: v is not None, ("tree", "chains"),
            "the risk head learns at the infer/defer decisions of multi-round rollouts"),
)


def combination_problems(model_args: dict[str, Any] | None, data_args: dict[str, Any]) -> list[str]:
    """One message per feature that is on with a rollout kind that does not implement it; ``model_args`` None
    checks the data's own features only (the DataModule alone, before it meets a module)."""
    rollout = data_args["rollout"]
    if rollout not in ROLLOUTS:
        return []  # reported as an unknown value
    problems = []
    for feature in FEATURES:
        section, *names = feature.knob.split(".")
        value = model_args if section == "model" else data_args
        for name in names:  # a group's field one level down
            value = value.get(name, MISSING) if isinstance(value, dict) else MISSING
        if value is MISSING:
            continue
        if feature.is_on(value) and rollout not in feature.rollouts:
            problems.append(f"{feature.knob} {value!r} with data.rollout {rollout!r}: {feature.why}; it takes "
                            f"data.rollout {' or '.join(repr(r) for r in feature.rollouts)}")
    return problems


def literal_choices(hint: Any) -> tuple[Any, ...] | None:
    """The values a ``Literal`` type (or ``Literal | None``) admits, None for any other type."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        members = [literal_choices(arg) if arg is not type(None) else (None,) for arg in typing.get_args(hint)]
        return None if any(m is None for m in members) else tuple(v for m in members for v in m)
    return None


def choice_problems(function: Callable, args: dict[str, Any]) -> list[str]:
    """One message per argument of ``function`` whose value is not among its ``Literal`` type's choices."""
    problems = []
    for name, hint in typing.get_type_hints(function).items():
        choices = literal_choices(hint)
        if choices is not None and name in args and args[name] not in choices:
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            problems.append(f"{name}: unknown value {args[name]!r}; valid choices: {shown}")
    return problems


def data_knob_problems(data_args: dict[str, Any]) -> list[str]:
    """The rules among RolloutDataModule's own knobs: sizes measured in groups and budgets in tokens (a knob out of
    its own range is reported by that knob alone)."""
    group_size, max_new_tokens = data_args["group_size"], data_args["max_new_tokens"]
    problems = []
    if group_size >= 1 and data_args["minibatch_size"] % group_size:
        problems.append(f"data.minibatch_size: {data_args['minibatch_size']} is not a multiple of group_size "
                        f"({group_size}); minibatches hold whole groups")
    cache = data_args["overlong_cache"]
    if cache is not None and max_new_tokens >= 1 and not 0 < cache <= max_new_tokens:
        problems.append(f"data.overlong_cache: must be in [1, max_new_tokens], got {cache} (max_new_tokens "
                        f"{max_new_tokens})")
    budget = data_args["completion_budget"]
    if budget is not None and group_size >= 1 and budget < group_size:
        problems.append(f"data.completion_budget: must be >= group_size ({group_size}) or None, got {budget}")
    return problems


@dataclass(frozen=True)
class TrainerFacts:
    """What the rules read of the trainer: its settings, from a config (None: not given there, the command's
    default applies) or from a built ``Trainer``."""

    world_size: int | None = None  # None: not known from a config (devices "auto")
    use_distributed_sampler: bool | None = None
    reload_dataloaders_every_n_epochs: int | None = None


def trainer_problems(trainer: TrainerFacts, data_args: dict[str, Any]) -> list[str]:
    """The trainer settings the rollouts depend on, and the data options that would let ranks draw different numbers
    of minibatches (a rank that stepped fewer times would leave the others waiting in an all-reduce forever)."""
    problems = []
    if trainer.reload_dataloaders_every_n_epochs not in (None, 1):
        problems.append(f"trainer.reload_dataloaders_every_n_epochs: must be 1, got "
                        f"{trainer.reload_dataloaders_every_n_epochs}: RolloutDataModule needs "
                        "Trainer(reload_dataloaders_every_n_epochs=1), else the first epoch's rollouts would be "
                        "trained on forever")
    world = trainer.world_size
    if world is None or world == 1:
        return problems
    if data_args["prompts_per_epoch"] % world:
        problems.append(f"data.prompts_per_epoch: {data_args['prompts_per_epoch']} is not a multiple of the {world} "
                        "ranks; every rank trains on an equal share of the epoch's prompts")
    if data_args["dynamic_sampling"]:
        problems.append(f"data.dynamic_sampling: not supported with {world} ranks (ranks would keep different numbers "
                        "of groups)")
    if data_args["completion_budget"] is not None:
        problems.append(f"data.completion_budget: not supported with {world} ranks (counted per process)")
    if trainer.use_distributed_sampler:
        problems.append("trainer.use_distributed_sampler: must be false; each rank's buffer is already its share")
    return problems


def risk_decision_problems(decision: str, task_name: str, task_names_answer_tokens: bool) -> list[str]:
    """``RiskThreshold(decision="value")`` forces answers at a round's first tokens: the task must name them."""
    if decision == "value" and not task_names_answer_tokens:
        task_name = task_name.removeprefix("LazyInstance_")  # jsonargparse's lazy_instance of the default task
        return [f"RiskThreshold decision: value forces answers, but the task {task_name} does not say which first "
                "tokens answer: give it an answer_token_ids(tokenizer) method, or use decision: threshold"]
    return []


def group_of_one_problems(model_args: dict[str, Any], data_args: dict[str, Any]) -> list[str]:
    if model_args["advantage_mode"] == "gdpo" and data_args.get("overlong_cache") is not None:
        return ["data.overlong_cache with model.advantage_mode 'gdpo': GDPO normalises each of the task's rewards "
                "apart, and the overlong penalty is none of them; leave overlong_cache unset (data.mask_truncated "
                "takes truncated completions out of the loss instead)"]
    if model_args["advantage_mode"] == "gdpo" and data_args["rollout"] != "grouped":
        return [f"model.advantage_mode 'gdpo' with data.rollout {data_args['rollout']!r}: GDPO normalises each of a "
                "task's rewards within a prompt's group of completions, and an episode is scored by its "
                "environment's one reward; use data.rollout 'grouped'"]
    if data_args["group_size"] == 1 and model_args["advantage_mode"] != "raw":
        return [f"data.group_size 1 with model.advantage_mode {model_args['advantage_mode']!r}: a group of one has "
                "advantage 0, so nothing would be learned; use group_size >= 2 (or advantage_mode 'raw')"]
    return []


def staleness_problems(max_staleness: int, rollout: str, engine: Any, old_logp_source: str | None,
                       sampler_correction: Any) -> list[str]:
    """Every reason ``max_staleness`` cannot run with these settings (``engine``: the engine or its class)."""
    if max_staleness < 0:
        return [f"data.max_staleness: must be >= 0, got {max_staleness}"]
    if max_staleness == 0:
        return []
    problems = []
    name = engine.__name__ if isinstance(engine, type) else type(engine).__name__
    copies = isinstance(engine, SamplesFromCopy) and bool(engine.samples_from_copy)
    if engine is not None and not copies:  # None: not importable, said apart
        problems.append(
            f"data.max_staleness {max_staleness} with data.engine {name}: it samples from the model being trained, "
            "which changes under it while the next rollouts are drawn; use lit_grpo.engines.VLLMEngine or "
            f"VLLMServerEngine (a custom engine that copies the weights it is pushed declares {SNAPSHOT_ATTRIBUTE} "
            "= True)")
    if rollout != "grouped":
        problems.append(f"data.max_staleness {max_staleness} with data.rollout {rollout!r}: a tree's rounds are "
                        "generated, scored and grown in turn; asynchronous rollouts take data.rollout 'grouped'")
    if old_logp_source == "trainer" and sampler_correction is None:
        problems.append(
            f"data.max_staleness {max_staleness} with model.old_logp_source 'trainer': pi_old recomputed by the "
            "current policy would ignore that an older one drew the tokens; use old_logp_source 'sampler' (or set "
            "model.sampler_correction, which weights each token by pi_old / pi_sampler)")
    return problems


def multi_round_problems(data_args: dict[str, Any], task: Any, model_args: dict[str, Any] | None = None,
                         task_args: dict[str, Any] | None = None) -> list[str]:
    """Tree and chain rollouts need a multi-round task (``task``: the task or its class; None when unknown), and
    ``data.branching`` one width per round the task declares (``declared_rounds``: no list is stretched or cut); a
    task whose turns need their episode (``StepsAlone`` not met: a tool task) runs over turns only, and the risk head
    needs a task that names the first tokens that defer (``NamesDeferTokens``).
    ``task_args``: a class's arguments as configured (its ``max_rounds`` or ``max_turns``), before it is built."""
    rollout = data_args["rollout"]
    cls = task if isinstance(task, type) or task is None else type(task)
    if cls is None:
        return []
    name = cls.__name__.removeprefix("LazyInstance_")
    if rollout in ("tree", "chains") and not issubclass(cls, MultiRound):
        return [f"data.rollout {rollout!r} needs a multi-round task (a MultiRoundTask subclass), got data.task "
                f"{name}; use data.rollout 'grouped' or a MultiRoundTask"]
    problems = []
    rounds, argument = declared_rounds(task, task_args) if rollout != "grouped" else (None, "")
    branching = data_args.get("branching")
    if rollout == "chains" and branching is not None:
        problems.append(f"data.branching {branching} with data.rollout 'chains': branching is a tree's widths; chains "
                        f"draw data.group_size episodes a prompt and take their turns from data.task "
                        f"({argument or 'max_rounds'}): remove data.branching")
    branching = list(branching or TREE_BRANCHING) if rollout == "tree" else None
    if isinstance(rounds, int) and rounds < 1:
        problems.append(f"data.task {name}: {argument or 'max_rounds'} must be >= 1 (the rounds an episode runs at "
                        f"most), got {rounds}")
    elif rounds is None and argument and rollout == "tree":
        problems.append(f"data.rollout 'tree' with data.task {name} {argument} null: a tree names one width per turn "
                        f"(data.branching); set data.task.init_args.{argument}, or use data.rollout 'chains' (no "
                        "limit: the task's token budget ends each episode)")
    elif isinstance(rounds, int) and isinstance(branching, list) and len(branching) != rounds:
        where = f", or set data.task.init_args.{argument}" if argument else ""
        problems.append(f"data.branching {branching} names {len(branching)} round(s), data.task {name} runs "
                        f"{argument or 'max_rounds'} {rounds}: give one width per round{where}")
    if rollout != "grouped" and "max_rounds" in getattr(cls, "__abstractmethods__", ()):
        problems.append(f"data.task {name} declares no max_rounds (the rounds an episode runs at most, one width "
                        "of data.branching each): give it a max_rounds attribute or __init__ argument")
    if rollout == "grouped" and issubclass(cls, MultiRound) and not issubclass(cls, StepsAlone):
        problems.append(f"data.task {name} runs episodes over turns: use data.rollout 'chains' (group-relative on "
                        "each episode's return, TRL's multi-turn GRPO) or 'tree' (branching at every turn)")
    if (model_args or {}).get("risk") is not None and issubclass(cls, MultiRound) \
            and not issubclass(cls, NamesDeferTokens):
        problems.append(f"model.risk with data.task {name}: the risk head needs a task that names the first tokens "
                        "that defer (a defer_token_ids(tokenizer) method); a tool task's turns are read by its "
                        "template's parser")
    return problems


ROUNDS_ARGUMENTS = ("max_rounds", "max_turns")  # how a multi-round task's __init__ names its rounds (a tool task's)


def declared_rounds(task: Any, task_args: dict[str, Any] | None) -> tuple[int | None, str]:
    """The rounds a multi-round task runs at most and the ``__init__`` argument that sets them (``max_rounds``, a
    tool task's ``max_turns``; "" for a class attribute): an instance's ``max_rounds``; a class's argument as
    configured in ``task_args`` or its default, else its class attribute. ``(None, "")`` when none is declared;
    ``(None, argument)`` when the argument sets no limit (a tool task's ``max_turns: null``)."""
    cls = task if isinstance(task, type) else type(task)
    try:
        declared = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a class without a Python signature: its attribute, if any
        declared = {}
    argument = next((a for a in ROUNDS_ARGUMENTS if a in declared), "")
    rounds = task.max_rounds if isinstance(task, DeclaresRounds) else None
    if isinstance(task, type) and argument:
        default = declared[argument].default
        rounds = (task_args or {}).get(argument, None if default is inspect.Parameter.empty else default)
    return (rounds, argument) if isinstance(rounds, int) else (None, argument if rounds is None else "")


def cross_knob_problems(model_args: dict[str, Any] | None, data_args: dict[str, Any] | None, engine: Any = None,
                        task: Any = None, trainer: TrainerFacts | None = None,
                        task_args: dict[str, Any] | None = None, rewards: list[Any] | None = None) -> list[str]:
    """The registry: every rule that spans knobs, of the module, the data and the trainer (and the engine and the
    task, each given as an object or its class; None when it could not be imported; ``rewards``: the task's
    configured reward classes, before it is built). ``model_args`` None runs the data's own rules only (the
    DataModule alone, before it meets a module), ``data_args`` None none (the module's own are
    ``PolicyModule.config_problems``'); the trainer's rules run when its ``TrainerFacts`` are given."""
    if data_args is None:
        return []
    model = model_args or {}
    problems = data_knob_problems(data_args)
    problems += [] if model_args is None else group_of_one_problems(model_args, data_args)
    problems += multi_round_problems(data_args, task, model_args, task_args)
    problems += reward_timeout_problems(data_args, task, rewards)
    problems += combination_problems(model_args, data_args)
    problems += staleness_problems(data_args.get("max_staleness", 0), data_args["rollout"], engine,
                                   model.get("old_logp_source"), model.get("sampler_correction"))
    problems += [] if trainer is None else trainer_problems(trainer, data_args)
    return problems
