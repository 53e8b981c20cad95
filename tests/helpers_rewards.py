"""User-style rewards that tests name by class path (``tests.helpers_rewards.<Name>``), as a user's YAML would."""

from collections.abc import Sequence

from lit_grpo.tasks import PromptRecord, Reward


class SignedReward(Reward):
    """+1 for the reference answer, -1 for any other answer; raises on a completion containing "boom".

    Its wrong answers score below 0, so a task using it must not give a crashing reward 0 (that would pay).
    """

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.min_value = -scale

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        if "boom" in completion_text:
            raise ValueError("reward exploded")
        return self.scale if completion_text.strip() == str(prompt_record["answer"]) else -self.scale


class StrictReward(SignedReward):
    """``SignedReward`` that refuses a scale that is not positive with a plain ``ValueError``, as a user's own class
    refuses its arguments."""

    def __init__(self, scale: float = 1.0) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        super().__init__(scale)


def interrupting(prompts: list, completions: list, **columns: object) -> list[float]:
    """A TRL-style reward that raises ``KeyboardInterrupt`` itself (a reward's bug, not the user's Ctrl-C)."""
    raise KeyboardInterrupt("the reward's own interrupt")


def exiting(prompts: list, completions: list, **columns: object) -> list[float]:
    """A TRL-style reward that calls ``sys.exit``."""
    raise SystemExit("the reward gave up")


class InterruptingReward(Reward):
    """A per-completion ``Reward`` raising ``KeyboardInterrupt`` itself."""

    min_value = 0.0

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        raise KeyboardInterrupt("the reward's own interrupt")
