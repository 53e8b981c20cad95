"""Prompts and reference answers from a JSON-lines file, scored by a reward given by class path (design §8)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from lit_grpo.input_check import InputError
from lit_grpo.tasks.base import ExactMatchReward, PromptRecord, Reward, Task


def read_jsonl(path: str | Path, prompt_key: str, answer_key: str) -> list[PromptRecord]:
    """Records of a JSON-lines file, each with ``prompt`` and ``answer`` copied from the given keys."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"prompt file {str(path)!r} does not exist or is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = "not UTF-8 text" if isinstance(error, UnicodeDecodeError) else (error.strerror or str(error))
        raise InputError(f"prompt file {str(path)!r} cannot be read: {reason}") from None
    records: list[PromptRecord] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict) or prompt_key not in row:
            raise InputError(f"{path}:{number}: expected an object with a {prompt_key!r} key")
        if not isinstance(row[prompt_key], str) or not row[prompt_key].strip():
            raise InputError(f"{path}:{number}: {prompt_key!r} must be a non-empty string, got {row[prompt_key]!r}")
        records.append({**row, "prompt": str(row[prompt_key]), "answer": row.get(answer_key, "")})
    if not records:
        raise InputError(f"prompt file {str(path)!r} is empty: it holds no records")
    return records


class JsonlTask(Task):
    """Prompts read from ``path`` (one JSON object per line), rewarded by ``reward``.

    Args:
        path: the training prompts' JSON-lines file.
        heldout_path: a separate held-out file; without it, ``heldout_fraction`` of ``path`` is held out.
        heldout_fraction: share of ``path`` held out (drawn with ``split_seed``) when there is no ``heldout_path``.
        prompt_key: the key of the prompt text in each object.
        answer_key: the key of the reference answer (used by exact-match rewards and accuracy).
        reward: the reward, by class path (a subclass of ``lit_grpo.tasks.Reward``); exact match by default.
        failure_reward: what a completion scores when the reward raises; ``None`` takes the reward's
            ``min_value`` and refuses a reward that declares none (a crash must never pay more than a wrong answer).
        split_seed: seed of the held-out draw and the training order.
        use_chat_template: see ``Task``.
    """

    def __init__(
        self,
        path: str,
        heldout_path: str | None = None,
        heldout_fraction: float = 0.1,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        reward: Reward | None = None,
        failure_reward: float | None = None,
        split_seed: int = 0,
        use_chat_template: bool = False,
    ) -> None:
        super().__init__(use_chat_template)
        if heldout_path is None and not 0 < heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
        self.path, self.heldout_path, self.heldout_fraction = path, heldout_path, heldout_fraction
        self.prompt_key, self.answer_key, self.split_seed = prompt_key, answer_key, split_seed
        self.reward_fn = reward if reward is not None else ExactMatchReward()
        if failure_reward is None and self.reward_fn.min_value is None:
            raise ValueError(
                f"{type(self.reward_fn).__name__} declares no min_value: set the task's failure_reward to its lowest "
                "score (what a completion gets when the reward raises)"
            )
        self._failure_reward = self.reward_fn.min_value if failure_reward is None else failure_reward

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord]]:
        records = read_jsonl(self.path, self.prompt_key, self.answer_key)
        random.Random(self.split_seed).shuffle(records)
        if self.heldout_path is not None:
            heldout = read_jsonl(self.heldout_path, self.prompt_key, self.answer_key)
            shared = {r["prompt"] for r in heldout} & {r["prompt"] for r in records}
            if shared:
                raise InputError(
                    f"{self.heldout_path} shares {len(shared)} prompts with {self.path} (e.g. {sorted(shared)[0]!r}); "
                    "the held-out split must be disjoint from training"
                )
            return records, heldout
        # held out by distinct prompt: a prompt repeated in the file must not sit on both sides
        prompts = list(dict.fromkeys(r["prompt"] for r in records))  # distinct, in shuffled order
        num_heldout = max(1, round(len(prompts) * self.heldout_fraction))
        if num_heldout >= len(prompts):
            raise InputError(f"prompt file {self.path!r} has {len(prompts)} distinct prompt(s): too few to hold "
                             f"{num_heldout} out and train on the rest; add prompts or give heldout_path")
        heldout = set(prompts[:num_heldout])
        return [r for r in records if r["prompt"] not in heldout], [r for r in records if r["prompt"] in heldout]

    @property
    def failure_reward(self) -> float:
        return self._failure_reward
