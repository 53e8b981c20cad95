"""One epoch of a run, top to bottom: the page to open first (``one_epoch.py``)."""

from lit_grpo.epoch.one_epoch import one_epoch

__all__ = ["one_epoch"]
