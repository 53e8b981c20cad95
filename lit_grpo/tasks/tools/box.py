"""One rollout's tools and environment, ``ToolBox``, as ``ToolKit.open`` (``kit.py``) hands it out: it runs an
assistant turn's calls in TRL's order (``tasks/tools/worker.py``), here or in the rollout's host process
(``tasks/tools/environment_host.py``), forks the environment for a tree's branch where the environment asks for it,
and goes back to the kit's pool when released (docs/guide.md#tools-and-environments)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from lit_grpo.mcp_tools import McpTool
from lit_grpo.run.worker_process import WorkerDied, WorkerTimedOut
from lit_grpo.tasks.tools.calls import ToolOutcome, environment_tools, tools_by_name
from lit_grpo.tasks.tools.environment_host import EnvironmentProxy, Host, can_fork, environment_copy
from lit_grpo.tasks.tools.worker import LOST, Answer, Job, guarded, outcome, phases, plan, run_phases

if TYPE_CHECKING:
    from lit_grpo.tasks.tools.kit import ToolKit


class ToolBox:
    """One rollout's tools and environment, from ``ToolKit.open``: ``call_turn`` runs an assistant turn's calls,
    ``fork`` gives a branch its own copy (where the environment asks for one), ``release`` returns it to the pool.
    ``environment`` is the live instance (in this process) or an ``EnvironmentProxy`` of the hosted one (None
    without an environment); ``lost`` is True once its host was killed (the episode must end)."""

    def __init__(self, kit: ToolKit, key: str | None, instance: Any, tools: Sequence[Callable],
                 host: Host | None = None, slot: int = 0, root: bool = True) -> None:
        self.kit, self.key, self.host, self.slot, self.root = kit, key, host, slot, root
        self.tools = tools_by_name(list(tools))
        self.released, self._lost, self._instance = False, False, instance
        hosted = host is not None and bool(kit.factories)
        self._proxy = EnvironmentProxy(self, type(kit.probe(key))) if hosted else None

    @property
    def environment(self) -> Any:
        return self._instance if self.host is None else self._proxy

    @property
    def lost(self) -> bool:
        return self._lost or (self.host is not None and not self.host.alive)

    def lose(self) -> None:
        """The host is gone (killed at a timeout, or ended): every box on it is lost."""
        self._lost = True
        if self.host is not None:
            self.kit.drop(self.host)

    def call_turn(self, calls: list[dict[str, Any]]) -> list[ToolOutcome]:
        """One assistant turn's parsed calls, answered in TRL's order: the sync calls' messages in call order, then
        the async calls' (awaited together); each call bounded by the kit's timeout."""
        if self.released:
            raise ValueError("ToolBox.call_turn after release(): a released box is not used")
        kit = self.kit
        jobs, ready, unbound = plan(calls, self.tools, kit.functions, kit.style, kit.check_types, kit.parallel_sync)
        answers: dict[int, Answer | str] = {}
        if jobs and self.host is None:
            run_phases(phases(jobs), self.tools, self.kit.style, self.kit.loop, answers.__setitem__)
        for here, group in itertools.groupby(phases(jobs) if self.host is not None else [], key=self.served_here):
            turn = list(group)
            if here:  # MCP calls: through their clients, in this process
                run_phases(turn, self.tools, kit.style, kit.loop, answers.__setitem__)
            elif self.lost:
                answers.update({job.index: "lost" for phase in turn for job in phase})
            else:
                assert self.host is not None and kit.timeout is not None
                try:
                    answers.update(self.host.turn(turn, self.slot, kit.timeout))
                except OSError:  # the host had ended between turns
                    answers.update({job.index: "lost" for phase in turn for job in phase})
                if any(isinstance(answer, str) for answer in answers.values()):
                    self.lose()
        outcomes = {**ready, **{job.index: outcome(job, answers[job.index], unbound, kit.style, kit.timeout,
                                                          kit.max_chars) for job in jobs}}
        awaited = {job.index for job in jobs if job.awaited}
        return [outcomes[index] for index in sorted(outcomes, key=lambda index: (index in awaited, index))]

    def served_here(self, phase: Sequence[Job]) -> bool:
        """Whether a phase's calls are MCP tools' (each is alone in its phase), which run here, not in the host."""
        return isinstance(self.tools[phase[0].name], McpTool)

    def fork(self) -> ToolBox | None:
        """A box with the environment's own copy, made by the environment's ``fork_environment()`` or
        ``__deepcopy__`` (hosted: made in its host, and a call past the timeout in either box then loses both);
        None where the class defines neither or the copy failed (the caller replays the path's calls on a fresh
        box). Without an environment, a box with the same tools."""
        if self.released:
            raise ValueError("ToolBox.fork after release(): a released box is not used")
        if not self.kit.factories:
            if self.host is not None:
                self.host.users += 1  # type: ignore[attr-defined]
            return ToolBox(self.kit, self.key, None, list(self.tools.values()), self.host, root=False)
        if not can_fork(type(self.kit.probe(self.key))) or self.lost:
            return None
        if self.host is None:
            copied, error = guarded(lambda: environment_copy(self._instance))
            if error is not None:
                return None
            return ToolBox(self.kit, self.key, copied, [*self.kit.functions, *environment_tools(copied),
                                                        *self.kit.served()], root=False)
        slot = self.host.slots
        self.host.slots += 1
        try:
            self.remote(("fork", self.slot, slot))
        except (TimeoutError, RuntimeError, TypeError):
            return None
        except (Exception, SystemExit):  # noqa: BLE001 - the environment's own copy raised (or exited)
            return None
        self.host.users += 1  # type: ignore[attr-defined]
        return ToolBox(self.kit, self.key, None, list(self.tools.values()), self.host, slot, root=False)

    def release(self) -> None:
        """The instance (or its host) goes back to its pool; a fork's copy is dropped. The box is not used after."""
        if self.released:
            return
        self.released = True
        if self.host is None:
            if self.root and self._instance is not None:
                self.kit.idle.setdefault(self.key, []).append(self._instance)
            return
        self.host.users -= 1  # type: ignore[attr-defined]
        if not self.host.alive:
            self.kit.drop(self.host)
            return
        if not self.root and self.kit.factories:
            self.host.send(("drop", self.slot))
        if self.host.users == 0:  # type: ignore[attr-defined]
            self.kit.idle.setdefault(self.key, []).append(self.host)

    def __deepcopy__(self, memo: dict[int, Any]) -> ToolBox:
        raise TypeError("a ToolBox is not copied (its environment is live, perhaps in another process): fork() it, "
                        "or replay the path's calls on a fresh box")

    def remote(self, message: tuple[Any, ...]) -> tuple[str, Any]:
        """The host's answer to a request about the environment; the environment's exception raised here, and
        ``TimeoutError`` or ``RuntimeError`` where the host is gone or goes (the box is then lost)."""
        if self.released or self.lost or self.host is None:
            raise RuntimeError("the environment is gone: its box was released" if self.released else LOST)
        try:
            self.host.send(message)
            kind, answer = self.host.receive(self.kit.timeout)
        except WorkerTimedOut:
            self.lose()
            raise TimeoutError(f"the environment's {message[0]} of {message[2]!r} timed out after "
                               f"{self.kit.timeout:g} s; its process was killed") from None
        except (WorkerDied, OSError):
            self.lose()
            raise RuntimeError(f"the environment's process ended during {message[0]} {message[2]!r}") from None
        if kind == "error":
            raise answer
        return kind, answer

    def environment_get(self, name: str) -> tuple[str, Any]:
        return self.remote(("get", self.slot, name))

    def environment_set(self, name: str, value: Any) -> None:
        self.remote(("set", self.slot, name, value))

    def environment_invoke(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.remote(("invoke", self.slot, name, args, kwargs))[1]
