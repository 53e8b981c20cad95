"""Running a model's code: a child process with limits, in namespaces where the kernel allows
(docs/guide.md#a-python-sandbox). A leaf below the tasks: stdlib and ``lit_grpo.errors`` only."""

from lit_grpo.sandbox.environment import CodeFailed, PythonSandbox
from lit_grpo.sandbox.limits import Limits

__all__ = ["CodeFailed", "Limits", "PythonSandbox"]
