"""The old path of the multi-round framework and the first games, kept for configs and code written before ``tasks/``
was grouped by kind (one line per name); the code is in ``lit_grpo.tasks.episodes``,
``lit_grpo.tasks.games.ask_or_answer``, ``lit_grpo.tasks.games.operands``."""

from lit_grpo.tasks.episodes import ChatReply as ChatReply
from lit_grpo.tasks.episodes import EnvStep as EnvStep
from lit_grpo.tasks.episodes import MultiRoundTask as MultiRoundTask
from lit_grpo.tasks.episodes import RowUnavailable as RowUnavailable
from lit_grpo.tasks.episodes import SegmentKind as SegmentKind
from lit_grpo.tasks.episodes import names_answer_tokens as names_answer_tokens
from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask as AskOrAnswerTask
from lit_grpo.tasks.games.operands import ClarifyTask as ClarifyTask
