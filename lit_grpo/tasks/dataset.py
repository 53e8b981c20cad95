"""Prompts from a ``datasets`` source (local files, a ``save_to_disk`` directory, or a hub id already cached), scored
by rewards as users write them: ``Reward`` classes or TRL-style batched functions, weighted."""

from __future__ import annotations

import random
from collections.abc import Sequence
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
from lit_grpo.tasks.reward_functions import (
    Completions,
    import_reward,
    is_batched,
    reward_name,
    reward_values,
    weighted_total,
)


class DatasetTask(Task):
    """Prompts from ``path`` with a held-out split, scored by ``rewards``.

    Args:
        path: a data file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``, ``.arrow``), a ``save_to_disk``
            directory, a folder of data files, or a hub id already in the local cache (nothing is downloaded).
        split: the training split (a single file holds one split, whatever it is called).
        test_split: a held-out split of the same source (or of ``test_path``).
        test_path: a separate source of held-out prompts (its ``test_split``, else its ``split``). Without
            ``test_split`` and ``test_path``, ``heldout_fraction`` of the distinct prompts of ``split`` are held out.
            A given held-out split must share no prompt with training.
        heldout_fraction: see ``test_path``.
        prompt_column: the prompt: a string, or a conversation (a list of ``{"role", "content"}`` messages, which
            always goes through the tokenizer's chat template with the generation prompt added).
        answer_column: the reference answer that ``accuracy`` and the default exact-match reward compare with.
        rewards: ``Reward`` classes (by class path; ``RewardModel`` for a reward model) or import paths of
            functions with TRL's signature ``f(prompts, completions, completion_ids, **columns) ->
            list[float | None]`` (``package.module.function`` or ``path/to/file.py:function``); exact match by
            default.
        reward_weights: one weight per reward (1 each by default).
        failure_reward: what a completion scores when a reward raises or none applies; ``None`` takes the lowest
            ``min_value`` of the rewards, which then must all declare one.
        split_seed: seed of the held-out draw and the training order.
        use_chat_template: render string prompts through the chat template as one user turn.
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
    ) -> None:
        super().__init__(use_chat_template)
        if test_split is None and test_path is None and not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.rewards = [import_reward(r) for r in (rewards or [ExactMatchReward()])]
        if reward_weights is not None and len(reward_weights) != len(self.rewards):
            raise ValueError(f"reward_weights has {len(reward_weights)} entries for {len(self.rewards)} rewards")
        self.weights = [1.0] * len(self.rewards) if reward_weights is None else [float(w) for w in reward_weights]
        self.names = unique_names([reward_name(r) for r in self.rewards])
        floors = [getattr(r, "min_value", None) for r in self.rewards]
        if failure_reward is None and any(f is None for f in floors):
            missing = [n for n, f in zip(self.names, floors) if f is None]
            raise ValueError(f"rewards {missing} declare no min_value: set data.task.init_args.failure_reward to the "
                             "lowest score (what a completion gets when a reward raises or none applies)")
        self._failure_reward = min(floors) if failure_reward is None else failure_reward
        self.path, self.split_name, self.test_split, self.test_path = path, split, test_split, test_path
        self.heldout_fraction, self.split_seed = heldout_fraction, split_seed
        self.prompt_column, self.answer_column = prompt_column, answer_column

    HELDOUT_SOURCE = "test_path or test_split"  # named in the message when too few prompts can be held out

    @property
    def failure_reward(self) -> float:
        return self._failure_reward

    def records(self, path: str, split: str) -> list[PromptRecord]:
        """The rows of ``split`` of ``path`` as prompt records (every column kept; ``prompt`` and ``answer`` from the
        mapped columns)."""
        rows = load_rows(path, split)
        if not rows:
            raise InputError(f"data file {path!r} (split {split!r}) is empty: it holds no rows")
        records = []
        for where, row in rows:
            if self.prompt_column not in row:
                raise InputError(f"{where}: no {self.prompt_column!r} column (it has: {', '.join(map(str, row))}); "
                                 "set data.task.init_args.prompt_column")
            prompt = row[self.prompt_column]
            if not (isinstance(prompt, str) and prompt.strip()) and not (is_conversation(prompt) and prompt):
                raise InputError(f"{where}: {self.prompt_column!r} must be a non-empty string or a list of chat "
                                 f"messages, got {prompt!r:.80}")
            records.append({**row, "prompt": prompt, "answer": row.get(self.answer_column, "")})
        return records

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord]]:
        records = self.records(self.path, self.split_name)
        random.Random(self.split_seed).shuffle(records)
        if self.test_split is not None or self.test_path is not None:
            source = self.test_path or self.path
            heldout = self.records(source, self.test_split or self.split_name)
            shared = {prompt_key(r) for r in heldout} & {prompt_key(r) for r in records}
            if shared:
                raise InputError(f"the held-out split ({source!r}) shares {len(shared)} prompt(s) with the training "
                                 f"split (e.g. {sorted(shared)[0]!r:.80}); it must be disjoint from training")
            return records, heldout
        keys = list(dict.fromkeys(prompt_key(r) for r in records))  # distinct prompts, in shuffled order
        count = max(1, round(len(keys) * self.heldout_fraction))
        if count >= len(keys):
            raise InputError(f"data file {self.path!r} has {len(keys)} distinct prompt(s): too few to hold {count} "
                             f"out and train on the rest; add prompts or give {self.HELDOUT_SOURCE}")
        heldout_keys = set(keys[:count])
        return ([r for r in records if prompt_key(r) not in heldout_keys],
                [r for r in records if prompt_key(r) in heldout_keys])

    @property
    def batched_rewards(self) -> bool:
        return any(is_batched(reward) for reward in self.rewards)

    def use_device(self, device: Any) -> None:
        for reward in self.rewards:
            if hasattr(reward, "use_device"):
                reward.use_device(device)

    def score(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> ScoredCompletion:
        return self.score_group([prompt_record], [completion_text], [completion_ids])[0]

    def score_group(self, records: Sequence[PromptRecord], texts: Sequence[str],
                    ids: Sequence[Sequence[int]]) -> list[ScoredCompletion]:
        """Every reward on the whole batch, then each completion's weighted sum of the rewards that apply."""
        batch = Completions(records, texts, ids, conversational=is_conversation(records[0]["prompt"]))
        columns, errors = [], [None] * len(texts)
        for name, reward in zip(self.names, self.rewards):
            values, failures = self.reward_column(reward, name, batch)
            columns.append(values)
            errors = [e or f for e, f in zip(errors, failures)]
        scored = []
        for index, (record, text) in enumerate(zip(records, texts)):
            parts = {name: values[index] for name, values in zip(self.names, columns)}
            total = weighted_total(list(parts.values()), self.weights)
            error = errors[index] or (None if total is not None else "ValueError: no reward applies to it (all None)")
            reward = self._failure_reward if error else total
            scored.append(ScoredCompletion(reward, self.is_correct(record, text), error, parts))
        return scored

    @staticmethod
    def reward_column(reward: Any, name: str, batch: Completions) -> tuple[list[float | None], list[str | None]]:
        """One reward's values for the batch and each completion's failure: a ``Reward`` is called per completion
        and fails alone; a batched function fails for the whole batch."""
        if not is_batched(reward):
            pairs = [checked_values(reward, name, batch.one(i)) for i in range(len(batch.texts))]
            return [values[0] for values, _ in pairs], [failures[0] for _, failures in pairs]
        return checked_values(reward, name, batch)


def checked_values(reward: Any, name: str, batch: Completions) -> tuple[list[float | None], list[str | None]]:
    """``reward_values``, with whatever the reward raises (``sys.exit`` included) as every completion's failure."""
    try:
        return reward_values(reward, batch), [None] * len(batch.texts)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any failure of user code must not kill the run
        return [None] * len(batch.texts), [f"{name}: {type(error).__name__}: {error}"] * len(batch.texts)


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
