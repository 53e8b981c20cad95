"""Plumbing below every part but the entry point: preflight rules, strategy, distributed helpers, resume, the run
directory, checkpoint writes, host memory and seeds."""
