"""The games: multi-round tasks whose environment answers a segment from the record and the round alone
(``GameTask.step``): the question games (``?`` asks, digits answer) over hidden operands, a calculator and stale
digits. ``lit_grpo.tasks.games.<name>`` was the module games.py's path before this package: its names stay here."""

from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask, reordered
from lit_grpo.tasks.games.calculator import CalculatorTask, expression, reduced
from lit_grpo.tasks.games.operands import HIDDEN, ClarifyTask, HiddenOperandsTask, OperandGame
from lit_grpo.tasks.games.stale_digits import StaleDigitsTask

__all__ = ["HIDDEN", "AskOrAnswerTask", "CalculatorTask", "ClarifyTask", "HiddenOperandsTask", "OperandGame",
           "StaleDigitsTask", "expression", "reduced", "reordered"]
