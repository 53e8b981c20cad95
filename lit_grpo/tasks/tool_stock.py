"""The old path of the stockroom environment, kept for configs and code written before ``tasks/`` was grouped by kind
(one line per name); the code is in ``lit_grpo.tasks.tools.stock``."""

from lit_grpo.tasks.tools.stock import Stockroom as Stockroom
from lit_grpo.tasks.tools.stock import stock_rows as stock_rows
