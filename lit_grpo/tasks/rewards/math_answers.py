"""Math answers checked as the field checks them: ``math-verify`` (Hugging Face's, the checker of most GRPO recipes for
GSM8K and MATH) parses the completion's answer (``\\boxed{}``, LaTeX, fractions, decimals, percentages) and the
record's gold answer, and compares them symbolically and numerically. An optional extra:
``pip install 'lit-grpo[math]'`` (``math-verify==0.9.0``).

math-verify bounds its own parsing and comparison with ``SIGALRM``, which works in a process's main thread only and
replaces whatever handler the process had; here both are off (``parsing_timeout=None``, ``timeout_seconds=None``).
What bounds a hostile answer (huge LaTeX or deeply nested braces: minutes of parsing; ``9^{9^{9^{9^{9}}}}``, whose
comparison never ends) is ``data.reward_timeout``: ``MathVerify`` is a per-completion ``Reward``, so the reward worker
(``lit_grpo.rollout.reward_worker``) calls it one completion per call and a hung one costs that completion alone,
counted in ``rollout/reward_errors``. Without a ``reward_timeout`` it would run in the trainer's process, unbounded:
it is refused then (``needs_reward_timeout``, ``lit_grpo.run.rules.reward_timeout_problems``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord, Reward

INSTALL = "pip install 'lit-grpo[math]' (math-verify==0.9.0)"


def timeouts_off_notice(record: logging.LogRecord) -> bool:
    """False for math-verify's warning that its signal timeouts are off (they are, on purpose: module docstring)."""
    return not str(record.msg).startswith("Timeout is disabled")


def math_verify() -> Any:
    """The ``math_verify`` module, or ``InputError`` saying how to install it; its warning that the signal timeouts
    are off is filtered out of its loggers."""
    try:
        import math_verify
    except ImportError as error:
        raise InputError(f"the MathVerify reward checks answers with math-verify, which does not import ({error}): "
                         f"{INSTALL}") from None
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if timeouts_off_notice not in logger.filters:
            logger.addFilter(timeouts_off_notice)
    return math_verify


def parsed(text: str) -> list[Any]:
    """What math-verify extracts from ``text`` (its default LaTeX and plain-expression extraction, the last answer
    of the text, a ``\\boxed{}`` one first): sympy expressions, then the matched string; ``[]`` when it holds no
    answer. No signal timeout; an error inside the parser is raised, not swallowed."""
    return math_verify().parse(text, parsing_timeout=None, raise_on_error=True)


def parsed_gold(text: str) -> list[Any]:
    """A gold answer as math-verify reads it: the text as LaTeX math (``$...$`` around it: bare LaTeX such as
    ``2\\sqrt{2}`` has no delimiters math-verify looks for, and read as it is would give ``2``), else as it is;
    ``ValueError`` when neither gives an answer."""
    gold = parsed(f"${text}$") or parsed(text)
    if not gold:
        raise ValueError(f"the gold answer {text!r:.80} does not parse as math (math-verify extracts nothing)")
    return gold


def equivalent(gold: list[Any], completion_text: str, float_rounding: int = 6) -> bool:
    """Whether the answer of ``completion_text`` is the parsed ``gold`` (math-verify's ``verify``: string, numeric
    within ``float_rounding`` decimals, then symbolic equality); a text with no answer is not."""
    answer = parsed(completion_text)
    return bool(answer) and math_verify().verify(gold, answer, float_rounding=float_rounding, timeout_seconds=None,
                                                 raise_on_error=True)


class MathVerify(Reward):
    """1.0 when the completion's answer equals the record's gold answer as math-verify compares them, else 0.0.

    ``\\boxed{1/2}``, ``0.5``, ``\\frac{2}{4}`` and ``50\\%`` all equal a gold ``\\frac{1}{2}``. A completion with
    no answer in it scores 0.0; one on which the parser or the comparison raises is a reward error (the task's
    failure reward, counted in ``rollout/reward_errors``), and so is a gold answer that does not parse. It needs a
    ``data.reward_timeout`` (refused without one): it is what bounds a hostile answer (module docstring).

    Args:
        column: the record's column holding the gold answer (``answer``: the task's ``answer_column``).
        float_rounding: decimals numbers are rounded to before they are compared (math-verify's default, 6).
    """

    min_value = 0.0
    needs_reward_timeout = True  # refused without data.reward_timeout (run/rules.py): nothing else bounds its calls

    def __init__(self, column: str = "answer", float_rounding: int = 6) -> None:
        math_verify()  # refused up front, by name, when the extra is not installed
        if float_rounding < 0:
            raise InputError(f"MathVerify: float_rounding must be >= 0 decimals, got {float_rounding}")
        self.column, self.float_rounding = column, float_rounding
        self._golds: dict[str, list[Any]] = {}  # each gold answer parsed once (per process)

    def gold(self, prompt_record: PromptRecord) -> list[Any]:
        """The record's gold answer, parsed (once per distinct answer text)."""
        if prompt_record.get(self.column) is None:
            raise ValueError(f"the record has no gold answer (column {self.column!r})")
        text = str(prompt_record[self.column])
        if text not in self._golds:
            self._golds[text] = parsed_gold(text)
        return self._golds[text]

    def __call__(self, prompt_record: PromptRecord, completion_text: str, completion_ids: Sequence[int]) -> float:
        return 1.0 if equivalent(self.gold(prompt_record), completion_text, self.float_rounding) else 0.0

    def __getstate__(self) -> dict[str, Any]:
        # a spawned reward worker (after CUDA) gets the reward pickled: its cache starts empty there
        return {**self.__dict__, "_golds": {}}
