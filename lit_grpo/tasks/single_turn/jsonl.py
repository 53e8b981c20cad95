"""``JsonlTask``: a ``DatasetTask`` over JSON-lines files, with the argument names of its older configs."""

from __future__ import annotations

from lit_grpo.tasks.base import PromptRecord, Reward
from lit_grpo.tasks.single_turn.dataset import DatasetTask, divided_by_prompt


class JsonlTask(DatasetTask):
    """Prompts read from ``path`` (one JSON object per line), rewarded by one ``reward``: ``DatasetTask`` under the
    names of its first version; ``DatasetTask`` takes any data source, several rewards and TRL-style functions.

    Args:
        path: the training prompts' JSON-lines file.
        heldout_path: a separate held-out file, divided between validation (its first half of distinct prompts,
            rounded up) and test; without it, ``heldout_fraction`` of ``path`` is held out and divided the same way.
        heldout_fraction: share of ``path``'s distinct prompts held out (drawn with ``split_seed``) when there is no
            ``heldout_path``.
        prompt_key: the key of the prompt (a string, or a list of chat messages) in each object.
        answer_key: the key of the reference answer (used by exact-match rewards and accuracy).
        reward: the reward, by class path (a subclass of ``lit_grpo.tasks.Reward``); exact match by default.
        failure_reward: what a completion scores when the reward raises; ``None`` takes the reward's
            ``min_value`` and refuses a reward that declares none (a crash must never pay more than a wrong answer).
        split_seed: seed of the held-out draw and the training order.
        use_chat_template: see ``Task``.
    """

    HELDOUT_SOURCE = "heldout_path"

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
        super().__init__(path, test_path=heldout_path, heldout_fraction=heldout_fraction, prompt_column=prompt_key,
                         answer_column=answer_key, rewards=None if reward is None else [reward],
                         failure_reward=failure_reward, split_seed=split_seed, use_chat_template=use_chat_template)
        self.reward_fn = self.rewards[0]

    def with_one_named(self, train: list[PromptRecord], validation: list[PromptRecord] | None,
                       test: list[PromptRecord] | None) -> tuple[list[PromptRecord], ...]:
        """``heldout_path`` is a held-out file, not a test split: divided by distinct prompt, its first half (rounded
        up, in file order) validating and the rest testing; training stays whole."""
        return (train, *divided_by_prompt(test or []))
