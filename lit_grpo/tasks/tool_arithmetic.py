"""The old path of the shipped tool task's tools, environments and rewards, kept for configs and code written before
``tasks/`` was grouped by kind (one line per name); the code is in ``lit_grpo.tasks.tools.arithmetic``."""

from lit_grpo.tasks.tools.arithmetic import ArithmeticEnvironment as ArithmeticEnvironment
from lit_grpo.tasks.tools.arithmetic import RegisterNote as RegisterNote
from lit_grpo.tasks.tools.arithmetic import Registers as Registers
from lit_grpo.tasks.tools.arithmetic import add as add
from lit_grpo.tasks.tools.arithmetic import arithmetic_rows as arithmetic_rows
from lit_grpo.tasks.tools.arithmetic import exact_answer as exact_answer
from lit_grpo.tasks.tools.arithmetic import multiply as multiply
from lit_grpo.tasks.tools.arithmetic import register_answer as register_answer
from lit_grpo.tasks.tools.arithmetic import replayed_answer as replayed_answer
