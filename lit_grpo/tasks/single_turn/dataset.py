"""Prompts from a ``datasets`` source (local files, a ``save_to_disk`` directory, or a hub id already cached), scored
by rewards as users write them: ``Reward`` classes or TRL-style batched functions, weighted."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import (
    ExactMatchReward,
    PromptRecord,
    Reward,
    ScoredCompletion,
    Task,
    is_conversation,
)
from lit_grpo.tasks.data_files import load_rows
from lit_grpo.tasks.rewards.answers import REWARD_LIMIT, Column, weights_problem
from lit_grpo.tasks.rewards.functions import (
    Completions,
    import_reward,
    is_batched,
    reward_column,
    reward_name,
    weighted_total,
)
from lit_grpo.tasks.rows import Located, check_rows, checked_record

ColumnCall = Callable[[int, Completions], Column]  # (reward index, batch) -> that reward's values and errors


class DatasetTask(Task):
    """Prompts from ``path`` in training, validation and test splits, scored by ``rewards``.

    The training split is always the whole of ``split`` less what is drawn from it; the held-out prompts are:
    - validation and test both named (``validation_split``/``validation_path`` and ``test_split``/``test_path``):
      each used whole, refused if they share a prompt with each other or with training;
    - only one of them named: that split used whole (a dataset's own test split stays its test split, every prompt
      of it), and the other one drawn from training: ``heldout_fraction`` of the distinct prompts of ``split``;
    - neither: ``heldout_fraction`` of the distinct prompts of ``split`` drawn and divided by distinct prompt, the
      first half (rounded up) validating and the rest testing.

    Args:
        path: a data file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``, ``.arrow``), a ``save_to_disk``
            directory, a folder of data files, or a hub id already in the local cache (nothing is downloaded).
        split: the training split (a single file holds one split, whatever it is called).
        test_split: the test split of the same source (or of ``test_path``).
        test_path: a separate source of test prompts (its ``test_split``, else its ``split``).
        heldout_fraction: the share of the distinct prompts of ``split`` held out when validation and test are not
            both named.
        prompt_column: the prompt: a string, or a conversation (a list of ``{"role", "content"}`` messages, which
            always goes through the tokenizer's chat template with the generation prompt added).
        answer_column: the reference answer that ``accuracy`` and the default exact-match reward compare with.
        rewards: ``Reward`` classes (by class path; ``RewardModel`` for a reward model) or import paths of
            functions with TRL's signature ``f(prompts, completions, completion_ids, **columns) ->
            list[float | None]`` (``package.module.function`` or ``path/to/file.py:function``); exact match by
            default.
        reward_weights: one weight per reward (1 each by default); finite, not all 0.
        failure_reward: what a completion scores when a reward raises, answers what is no reward (±inf, a string;
            see ``lit_grpo.tasks.rewards.answers``) or none applies; ``None`` takes the lowest ``min_value`` of the
            rewards, which then must all declare one.
        split_seed: seed of the held-out draw and the training order.
        use_chat_template: render string prompts through the chat template as one user turn.
        validation_split: the validation split of the same source (or of ``validation_path``).
        validation_path: a separate source of validation prompts (its ``validation_split``, else its ``split``).
    """

    def __init__(
        self,
        path: str,
        split: str = "train",
        test_split: str | None = None,
        test_path: str | None = None,
        heldout_fraction: float = 0.1,
        prompt_column: str = "prompt",
        answer_column: str = "answer",
        rewards: list[Reward | str] | None = None,
        reward_weights: list[float] | None = None,
        failure_reward: float | None = None,
        split_seed: int = 0,
        use_chat_template: bool = False,
        validation_split: str | None = None,
        validation_path: str | None = None,
    ) -> None:
        super().__init__(use_chat_template)
        both_named = (validation_split, validation_path) != (None, None) and (test_split, test_path) != (None, None)
        if not both_named and not 0 < heldout_fraction < 1:
            raise InputError(f"data.task.init_args.heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.rewards = [import_reward(r) for r in (rewards or [ExactMatchReward()])]
        problem = weights_problem(reward_weights, len(self.rewards))
        if problem:
            raise InputError(f"data.task.init_args.{problem}")
        if failure_reward is not None and not (math.isfinite(failure_reward) and abs(failure_reward) <= REWARD_LIMIT):
            raise InputError(f"data.task.init_args.failure_reward is {failure_reward!r}; give a finite number within "
                             f"±{REWARD_LIMIT:g} (what a completion scores when a reward fails)")
        self.weights = [1.0] * len(self.rewards) if reward_weights is None else [float(w) for w in reward_weights]
        self.names = unique_names([reward_name(r) for r in self.rewards])
        floors = [getattr(r, "min_value", None) for r in self.rewards]
        if failure_reward is None and any(f is None for f in floors):
            missing = [n for n, f in zip(self.names, floors) if f is None]
            raise InputError(f"rewards {missing} declare no min_value: set data.task.init_args.failure_reward to the "
                             "lowest score (what a completion gets when a reward raises or none applies)")
        self._failure_reward = min(floors) if failure_reward is None else failure_reward
        self.path, self.split_name, self.test_split, self.test_path = path, split, test_split, test_path
        self.validation_split, self.validation_path = validation_split, validation_path
        self.heldout_fraction, self.split_seed = heldout_fraction, split_seed
        self.prompt_column, self.answer_column = prompt_column, answer_column

    # named in the message when too few prompts can be held out
    HELDOUT_SOURCE = "both a validation and a test split (validation_split or validation_path, test_split or test_path)"

    @property
    def failure_reward(self) -> float:
        return self._failure_reward

    def records(self, path: str, split: str) -> list[PromptRecord]:
        """The rows of ``split`` of ``path`` as prompt records (every column kept; ``prompt`` and ``answer`` from the
        mapped columns), each row checked (``lit_grpo.tasks.rows``)."""
        return [record for _, record in self.located(path, split)]

    def located(self, path: str, split: str) -> list[Located]:
        """``records`` with where each row is (for messages)."""
        rows = load_rows(path, split)
        if not rows:
            raise InputError(f"data file {path!r} (split {split!r}) is empty: it holds no rows")
        compared = self.answers_compared
        located = [(where, checked_record(where, row, self.prompt_column, self.answer_column, compared))
                   for where, row in rows]
        answerless = [where for where, row in rows if row.get(self.answer_column) is None]
        check_rows(located, compared, any(not isinstance(r, Reward) for r in self.rewards), answerless)
        return located

    @property
    def answers_compared(self) -> bool:
        """Whether a reward compares completions with the ``answer`` column (exact match, the default)."""
        return any(isinstance(reward, ExactMatchReward) for reward in self.rewards)

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        located = self.located(self.path, self.split_name)
        train = [record for _, record in located]
        random.Random(self.split_seed).shuffle(train)
        validation = self.named_split("validation", self.validation_path, self.validation_split, train, located[0])
        test = self.named_split("test", self.test_path, self.test_split, train, located[0])
        if validation is None and test is None:
            train, heldout = self.drawn_heldout(train)
            validation, test = divided_by_prompt(heldout)
        elif validation is None or test is None:
            train, validation, test = self.with_one_named(train, validation, test)
        else:
            refuse_shared(validation, test, f"the validation split ({self.validation_path or self.path!r})",
                          f"the test split ({self.test_path or self.path!r})")
        if self.answers_compared and not any(str(r["answer"]).strip() for r in [*train, *validation, *test]):
            raise InputError(f"data file {self.path!r}: no row has an answer ({self.answer_column!r} column), and the "
                             "default exact-match reward compares completions with it (only an empty completion "
                             "would score): set data.task.init_args.answer_column, or give rewards")
        return train, validation, test

    def with_one_named(self, train: list[PromptRecord], validation: list[PromptRecord] | None,
                       test: list[PromptRecord] | None) -> tuple[list[PromptRecord], ...]:
        """``(training, validation, test)`` when one held-out split is named: it is used whole, and the other is
        ``heldout_fraction`` of the distinct training prompts (``drawn_heldout``)."""
        train, drawn = self.drawn_heldout(train)
        return (train, validation, drawn) if validation is not None else (train, drawn, test)

    def named_split(self, name: str, path: str | None, split: str | None, train: Sequence[PromptRecord],
                    first: Located) -> list[PromptRecord] | None:
        """The records of a named held-out split (``path``'s ``split``; ``None`` when neither is given), in file
        order and in the form of the training rows (``first``: the first of them, where it is), sharing no prompt
        with ``train``."""
        if path is None and split is None:
            return None
        source = path or self.path
        held = self.located(source, split or self.split_name)
        check_rows([first, held[0]], False, False)  # one prompt form in every split
        records = [record for _, record in held]
        refuse_shared(records, train, f"the {name} split ({source!r})", "the training split")
        return records

    def drawn_heldout(self, records: list[PromptRecord]) -> tuple[list[PromptRecord], list[PromptRecord]]:
        """``(training, held-out)``: ``heldout_fraction`` of the distinct prompts of ``records`` held out."""
        keys = list(dict.fromkeys(prompt_key(r) for r in records))  # distinct prompts, in shuffled order
        count = max(1, round(len(keys) * self.heldout_fraction))
        if count >= len(keys):
            raise InputError(f"data file {self.path!r} has {len(keys)} distinct prompt(s): too few to hold {count} "
                             f"out and train on the rest; add prompts or give {self.HELDOUT_SOURCE}")
        heldout_keys = set(keys[:count])
        return ([r for r in records if prompt_key(r) not in heldout_keys],
                [r for r in records if prompt_key(r) in heldout_keys])

    def use_device(self, device: Any) -> None:
        """Called at setup, before the model loads: the rows load and are checked now, and a reward model moves to
        ``device``."""
        self.train_records()
        for reward in self.rewards:
            if hasattr(reward, "use_device"):
                reward.use_device(device)

    def score(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> ScoredCompletion:
        return self.score_group([prompt_record], [completion_text], [completion_ids])[0]

    def score_group(self, records: Sequence[PromptRecord], texts: Sequence[str], ids: Sequence[Sequence[int]],
                    column: ColumnCall | None = None) -> list[ScoredCompletion]:
        """Every reward on the whole batch (``column``: how one reward's calls are made, by default ``self.column``;
        a reward worker bounds each call in time), then each completion's weighted sum of the rewards that apply."""
        batch = Completions(records, texts, ids, conversational=is_conversation(records[0]["prompt"]))
        columns = [(column or self.column)(index, batch) for index in range(len(self.rewards))]
        return self.combined(batch, columns)

    def data_source(self) -> str | None:
        return self.path if isinstance(self.path, str) else None

    def reward_weights(self) -> dict[str, float]:
        return {name: float(weight) for name, weight in zip(self.names, self.weights)}

    def column(self, index: int, batch: Completions) -> Column:
        """Reward ``index``'s values and errors on ``batch``: a ``Reward`` is called per completion and fails alone;
        a batched function is called once."""
        reward, name = self.rewards[index], self.names[index]
        if is_batched(reward):
            return reward_column(reward, name, batch)
        singles = [reward_column(reward, name, batch.one(i)) for i in range(len(batch.texts))]
        return [values[0] for values, _ in singles], [errors[0] for _, errors in singles]

    def combined(self, batch: Completions, columns: Sequence[Column]) -> list[ScoredCompletion]:
        """Each completion's score from every reward's column: the weighted sum of the values that apply, or
        ``failure_reward`` when a reward failed on it (its errors joined), none applies, or the sum is out of
        range. The other completions, and the other rewards' values in ``parts``, are unaffected."""
        scored = []
        for index, (record, text) in enumerate(zip(batch.records, batch.texts)):
            parts = {name: values[index] for name, (values, _) in zip(self.names, columns)}
            errors = [e for _, failures in columns if (e := failures[index]) is not None]
            total = weighted_total(list(parts.values()), self.weights)
            if not errors and total is None:
                errors = ["no reward applies to it (each gave None or NaN)"]
            elif not errors and not abs(total) <= REWARD_LIMIT:
                errors = [f"the weighted sum {total!r} is not within ±{REWARD_LIMIT:g}"]
            reward = self._failure_reward if errors else total
            scored.append(ScoredCompletion(reward, self.is_correct(record, text), "; ".join(errors) or None, parts))
        return scored


def divided_by_prompt(records: Sequence[PromptRecord]) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """``(validation, test)``: the records of the first half of the distinct prompts (rounded up, in order) and
    those of the rest, so that a prompt given twice stays on one side."""
    keys = list(dict.fromkeys(prompt_key(r) for r in records))
    first = set(keys[: -(-len(keys) // 2)])
    return [r for r in records if prompt_key(r) in first], [r for r in records if prompt_key(r) not in first]


def refuse_shared(records: Sequence[PromptRecord], others: Sequence[PromptRecord], name: str, other_name: str) -> None:
    """Refuse two splits that share a prompt."""
    shared = {prompt_key(r) for r in records} & {prompt_key(r) for r in others}
    if shared:
        raise InputError(f"{name} shares {len(shared)} prompt(s) with {other_name} (e.g. {min(shared)!r:.80}); "
                         "held-out splits must be disjoint from training and from each other")


def prompt_key(record: PromptRecord) -> str:
    """What makes two prompts the same for the held-out split: the text, or the conversation's messages."""
    prompt = record["prompt"]
    return repr([(m["role"], m["content"]) for m in prompt]) if is_conversation(prompt) else prompt


def unique_names(names: list[str]) -> list[str]:
    """Metric names: a name given twice gets ``_2``, ``_3``, ..."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
