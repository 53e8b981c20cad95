"""Two reward functions written for TRL's GRPOTrainer (its signature: prompts, completions, completion_ids and every
dataset column as keyword lists; conversational completions as [{"role": "assistant", "content": ...}]). lit-grpo
runs this file unchanged: configs/trl_style.yaml names them as examples/trl_rewards.py:accuracy and :brevity."""


def accuracy(completions, solution, **kwargs):
    """1 when the answer is the solution column's, else 0."""
    return [1.0 if completion[0]["content"].strip() == answer else 0.0
            for completion, answer in zip(completions, solution)]


def brevity(completions, solution, **kwargs):
    """-0.01 per character of the answer, judged only where the solution has three digits (None elsewhere: the
    reward does not apply to that sample)."""
    return [-0.01 * len(completion[0]["content"]) if len(answer) == 3 else None
            for completion, answer in zip(completions, solution)]
