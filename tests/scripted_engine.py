"""The fake rollout engine of the tool-turn tests (the unit under test is the turn logic; engines are tested for real
elsewhere): each context gets the completions a script names for it, as text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lit_grpo.engines import Completion


class ScriptedEngine:
    """Gives each context the completions ``script(turn, context_text)`` names (``turn``: the assistant turns the
    context holds, counted by ``turn_marker``), each encoded by ``tokenizer`` and closed by the ``end`` id, every
    token at log-prob -0.25; keeps the contexts and sampling specs it was given and counts ``end_turns`` calls."""

    def __init__(self, script: Callable[[int, str], list[str]], tokenizer: Any, end: int,
                 turn_marker: str = "<|im_start|>assistant") -> None:
        self.script, self.tokenizer, self.end, self.turn_marker = script, tokenizer, end, turn_marker
        self.contexts: list[list[int]] = []
        self.specs: list[Any] = []
        self.ended = 0

    def end_turns(self) -> None:
        self.ended += 1

    def generate(self, prompts: list[list[int]], n: int, sampling: Any) -> list[list[Completion]]:
        self.contexts += prompts
        self.specs.append(sampling)
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            texts = self.script(text.count(self.turn_marker), text)
            assert len(texts) == n
            ids = [tuple(self.tokenizer(t, add_special_tokens=False)["input_ids"]) + (self.end,) for t in texts]
            out.append([Completion(i, tuple(-0.25 for _ in i), "stop") for i in ids])
        return out
