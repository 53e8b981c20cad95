"""A tool task's episode figures, under TRL's names: the tool calls (``tools/*``) and each reward (``rewards/<name>/*``,
with what rewards logged through ``log_metric``), combined over ranks before dividing, and the table of whole
conversations. Read by ``RolloutMetrics`` (``metrics.py``)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from lit_grpo.tree import Node, SegmentNode

UNKNOWN_TOOL = "unknown"  # the key of calls that name no tool the episodes declare


def tool_stats(roots: list[Any]) -> dict[str, float]:
    """A tool task's figures over one process's trees (``tool_figures`` of its ``tool_counts``); empty for other
    tasks. Under DDP the callback logs ``global_tool_stats`` instead: the same figures over every rank's trees."""
    counted = tool_counts(roots)
    return {} if counted is None else tool_figures(*counted)


def global_tool_stats(roots: list[Any], strategy: Any, world_size: int,
                      declared: Iterable[str] = ()) -> dict[str, float]:
    """``tool_stats`` over every rank's trees, equal on every rank: each rank's declared names and counts are
    gathered (one object broadcast per rank, every epoch, on every rank alike: the collective never depends on what
    a rank drew), the names united (with ``declared``, the task's own list where the caller has it) and the counts
    summed, then divided once. So every rank logs the same names and values, which a mean over ranks
    (``sync_dist``) leaves as they are, and which equal one process's figures on the union of the trees (a mean of
    the ranks' own ratios would not: their episodes and calls differ in number). Empty on every rank where no rank
    holds a tool episode and nothing is declared."""
    mine = tool_counts(roots)
    every = [mine] if world_size == 1 else [strategy.broadcast(mine, src) for src in range(world_size)]
    found = [counted for counted in every if counted is not None]
    names = frozenset(declared).union(*(names for names, _ in found))
    if not found and not names:
        return {}
    return tool_figures(names, sum((counts for _, counts in found), Counter()))


def tool_counts(roots: list[Any]) -> tuple[frozenset[str], Counter[str]] | None:
    """One rank's tool counts, as sums that add up over ranks: the tool names the episodes' schemas declare
    (``schema["function"]["name"]``), and ``episodes`` (the leaves holding an ``Episode``), ``turns`` (their
    depths), ``cut``, ``malformed``, ``path_calls/<name>`` and ``path_failures/<name>`` (each episode's whole path,
    by the name called), and ``calls`` and ``failures`` counting each call once: a node's own calls are its
    episode's cumulative counts less its nearest ancestor's (the root's episode is the start state), so a call
    high in a tree counts once, not once per leaf below it. None where no node holds an ``Episode`` (not a tool
    task)."""
    from lit_grpo.tasks.tools.episode import Episode

    declared: set[str] = set()
    counts: Counter[str] = Counter()
    found = False
    pending: list[tuple[Node, Any]] = [(root, None) for root in roots]
    while pending:
        node, above = pending.pop()
        episode = node.episode if isinstance(node, SegmentNode) else None
        if isinstance(episode, Episode):
            found = True
            declared.update(schema["function"]["name"] for schema in episode.schemas)
            before_calls, before_failures = (above.calls, above.failures) if above is not None else ({}, {})
            counts["calls"] += sum(episode.calls.values()) - sum(before_calls.values())
            counts["failures"] += sum(episode.failures.values()) - sum(before_failures.values())
            above = episode
        pending.extend((child, above) for child in node.children)
    if not found:
        return None
    for leaf, depth in tool_leaves(roots):
        counts.update({"episodes": 1, "turns": depth, "cut": leaf.kind == "cut",
                       "malformed": leaf.kind == "malformed"})
        counts.update({f"path_calls/{name}": n for name, n in leaf.episode.calls.items()})
        counts.update({f"path_failures/{name}": n for name, n in leaf.episode.failures.items()})
    return frozenset(declared), counts


def tool_figures(declared: frozenset[str], counts: Counter[str]) -> dict[str, float]:
    """TRL's ``tools/call_frequency`` (calls per episode) and ``tools/failure_frequency`` (failed calls per call,
    each call counted once), ``tools/calls/<name>`` and ``tools/failures/<name>`` per episode for every declared
    tool (0 where none was called) and under ``tools/calls/unknown`` / ``tools/failures/unknown`` the calls naming
    none (a declared tool named "unknown" shares that key), turns per episode, and the shares of episodes cut at
    the turn limit and of malformed ones. Per-episode figures average over the episodes (leaves, each its whole
    path). Example: a root-level call that fails, then 4 branches that each call once: 5 calls, 1 failed, 0.2 (not
    the 4 / 8 of counting per leaf); 2 calls per episode."""
    per = max(counts["episodes"], 1)  # a rank with no episode still logs every name, as zeros
    calls = {name: counts[f"path_calls/{name}"] for name in declared}
    failures = {name: counts[f"path_failures/{name}"] for name in declared}
    for key, n in counts.items():
        kind, _, name = key.partition("/")
        if kind in ("path_calls", "path_failures") and name not in declared:
            table = calls if kind == "path_calls" else failures
            table[UNKNOWN_TOOL] = table.get(UNKNOWN_TOOL, 0) + n
    stats = {"tools/call_frequency": sum(calls.values()) / per,
             "tools/failure_frequency": counts["failures"] / counts["calls"] if counts["calls"] else 0.0,
             "tools/turns_per_episode": counts["turns"] / per,
             "tools/cut_episodes": counts["cut"] / per,
             "tools/malformed_episodes": counts["malformed"] / per}
    for name in sorted(declared | {UNKNOWN_TOOL}):
        stats[f"tools/calls/{name}"] = calls.get(name, 0) / per
        stats[f"tools/failures/{name}"] = failures.get(name, 0) / per
    return stats


def tool_leaves(roots: list[Any]) -> list[tuple[Any, int]]:
    """The leaves of a tool task's trees that hold their ``Episode``, with their depths (a node the environment
    closed at the depth limit is a plain Node, with no episode)."""
    from lit_grpo.tasks.tools.episode import Episode

    return [(node, depth) for root in roots for node, depth in leaves_with_depth(root)
            if isinstance(node, SegmentNode) and isinstance(node.episode, Episode)]


def message_text(message: dict[str, Any]) -> str:
    """One chat message on one line: an assistant's calls as ``name(arguments)``, a tool's answer by the tool's
    name."""
    role, content = message.get("role", "?"), str(message.get("content") or "")
    calls = [call.get("function", {}) for call in message.get("tool_calls") or []]
    called = " ".join(f"{c.get('name')}({json.dumps(c.get('arguments'))})" for c in calls)
    name = f"({message['name']})" if role == "tool" and message.get("name") else ""
    return f"**{role}{name}**: " + " ".join(part for part in (content.strip(), called) if part)


def table_cell(text: str) -> str:
    """``text`` as one markdown table cell (its pipes escaped, its newlines spaces)."""
    return text.replace("|", "\\|").replace("\n", " ")


def conversations_table(roots: list[Any], max_rows: int) -> str:
    """A markdown table of the first tool episodes: the prompt's last message, the whole conversation after it
    (assistant turns, their calls and the tool messages), the episode's return, and a column for each value the
    rewards logged with ``log_extra`` (one value per episode of the batch). Empty for other tasks."""
    leaves = tool_leaves(roots)[:max_rows]
    if not leaves:
        return ""
    extra = list(dict.fromkeys(column for leaf, _ in leaves for column in getattr(leaf.episode, "extra", {})))
    lines = ["| prompt | conversation | return |" + "".join(f" {table_cell(c)} |" for c in extra),
             "|---|---|---|" + "---|" * len(extra)]
    for leaf, _ in leaves:
        episode = leaf.episode
        prompt = message_text(episode.messages[episode.prompt_messages - 1])
        turns = "<br>".join(message_text(m) for m in episode.completion)
        logged = "".join(f" {table_cell(str(episode.extra.get(c, '')))} |" for c in extra)
        lines.append(f"| {table_cell(prompt)} | {table_cell(turns)} | {leaf.reward:.3f} |{logged}")
    return "\n".join(lines)


def leaves_with_depth(root: Node) -> list[tuple[Node, int]]:
    """Every terminal node under ``root`` with its depth (the root is 0), depth first."""
    found, pending = [], [(root, 0)]
    while pending:
        node, depth = pending.pop()
        if node.terminal and not node.children:
            found.append((node, depth))
        pending.extend((child, depth + 1) for child in reversed(node.children))
    return found




def episode_stats(roots: list[Any], logged: Mapping[str, tuple[float, int]], strategy: Any, world_size: int,
                  declared: Iterable[str] = ()) -> dict[str, float]:
    """The tool figures (``global_tool_stats``) and the reward figures (``global_reward_stats``) of a tool task's
    episodes, equal on every rank."""
    return {**global_tool_stats(roots, strategy, world_size, declared),
            **global_reward_stats(roots, logged, strategy, world_size)}


def reward_counts(roots: list[Any], logged: Mapping[str, tuple[float, int]]) -> Counter[str]:
    """One rank's reward sums, as sums that add up over ranks: per reward name over the episodes it scored
    (``n/<name>``, ``sum/<name>``, ``squares/<name>``, from each ended episode's ``parts``), and per name a reward
    logged with ``log_metric`` (``logged_n/<name>``, ``logged_sum/<name>``)."""
    counts: Counter[str] = Counter()
    for leaf, _ in tool_leaves(roots):
        for name, value in leaf.episode.parts.items():
            counts[f"names/{name}"] = 0  # the name is known, scored or not (update keeps a zero entry)
            if value is not None and math.isfinite(value):
                counts.update({f"n/{name}": 1, f"sum/{name}": value, f"squares/{name}": value * value})
    for name, (total, n) in logged.items():
        counts.update({f"logged_n/{name}": n, f"logged_sum/{name}": total})
    return counts


def global_reward_stats(roots: list[Any], logged: Mapping[str, tuple[float, int]], strategy: Any,
                        world_size: int) -> dict[str, float]:
    """``rewards/<name>/mean`` and ``rewards/<name>/std`` (logged as ``rollout/rewards/...``, as the grouped
    rollouts' per-reward figures are, the population std as theirs) over the episodes each reward scored on every
    rank, and the mean of each value rewards logged with ``log_metric`` (``rollout/logged/<name>``), equal on every
    rank: each rank's sums are gathered (one broadcast per rank, every epoch on
    every rank alike), summed, then divided. Example: one reward scoring 1 and 0 on one rank and 1 on another:
    mean 2/3, std 0.471."""
    mine = reward_counts(roots, logged)
    every = [mine] if world_size == 1 else [strategy.broadcast(mine, src) for src in range(world_size)]
    total: Counter[str] = Counter()
    for counts in every:  # update, not +: Counter's + drops zero and negative sums (a reward may be negative)
        total.update(counts)
    stats = {}
    for key in sorted(total):
        kind, _, name = key.partition("/")
        if kind == "names":
            n = total[f"n/{name}"]
            mean = total[f"sum/{name}"] / n if n else 0.0
            variance = (total[f"squares/{name}"] - n * mean * mean) / n if n else 0.0
            stats[f"rewards/{name}/mean"] = mean
            stats[f"rewards/{name}/std"] = math.sqrt(max(variance, 0.0))
        elif kind == "logged_n":
            stats[f"logged/{name}"] = total[f"logged_sum/{name}"] / max(total[key], 1)
    return stats
