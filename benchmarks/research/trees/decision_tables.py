"""Runs of benchmarks/research/trees/tree_vs_chains.py read decision by decision (issue 49): what a policy does at each
information state, beside the policies that ignore a decision.

An information state is what the policy can see when it decides: on the decision-hard game (stale digits) the
prompt's cue (``A``..``D``) and the last reply (``start`` before any question, ``a``/``b``/``c`` when the reply
revealed that digit, ``none`` when it said nothing stale is left); on the other games the round (``round1``, ...)
under the prompt's visible shape (hidden operands: how many ``?`` it shows; calculator: its operand count).

- ``greedy_table``: a trained policy's greedy episodes on held-out prompts: per cue its return, accuracy and
  questions; per state how often it asked, answered or wrote something malformed.
- ``cue_free_policies``: on the stale-digits records, exactly, the returns per cue of the policies that read no cue
  (answer at once; ask until ``none;``; ask until the reply names ``c`` or ``none;``, i.e. until every digit is
  known) and of the oracle (which reads the cue): a run's per-cue return beside these says which one it equals.
- ``DecisionLog``: a training callback that counts, per state, the actions the rollouts sampled and the advantages
  they got (their sum and how many were positive, zero, negative), epoch by epoch, into a JSON file.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

ACTIONS = ("ask", "answer", "malformed")


def cue_of(record: dict) -> str:
    """The visible part of a prompt that should change the decision: the stale-digits cue, the hidden operands'
    count of ``?``, the calculator's operand count."""
    if "cue" in record:
        return record["cue"]
    if "hidden" in record:
        return f"{record['prompt'].count('?')}?"
    return f"{len(record['operands'])} operands" if "operands" in record else "all"


def state_of(record: dict, reply: str | None, depth: int) -> str:
    """The state at round ``depth`` (1-based) after the environment's last ``reply`` (None: no question yet)."""
    if "cue" not in record:
        return f"round{depth}"
    if reply is None:
        return "start"
    return "none" if reply.startswith("none") else reply.split("=", 1)[0]


def path_states(task: Any, root: Any) -> list[tuple[Any, str, str]]:
    """``(node, cue, state)`` for every policy segment under ``root``: the state is read off the replies to the
    questions before it (every segment above an answer was a question: ``task.reply`` gives what it was told)."""
    from lit_grpo.tree import policy_nodes, walk

    depth_of = {id(node): len(path) for path, node in walk(root)}
    out = []
    for node in policy_nodes(root):
        depth = depth_of[id(node)]
        reply = None if depth == 1 else task.reply(node.record, depth - 1)
        out.append((node, cue_of(node.record), state_of(node.record, reply, depth)))
    return out


def greedy_table(task: Any, roots: list[Any]) -> dict[str, Any]:
    """Per cue (return, accuracy, questions, prompts) and per ``cue|state`` the greedy actions' counts."""
    from lit_grpo.tree import depth_first

    per_cue: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    actions: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(ACTIONS, 0))
    for root in roots:
        path = depth_first(root)[1:]
        cue = cue_of(root.record)
        per_cue[cue].append((sum(n.reward for n in path), float(bool(getattr(path[-1], "correct", False))),
                             float(sum(getattr(n, "kind", "") == "ask" for n in path))))
        for node, _, state in path_states(task, root):
            actions[f"{cue}|{state}"][node.kind if node.kind in ACTIONS else "malformed"] += 1
    cues = {cue: {"return": statistics.fmean(e[0] for e in eps), "accuracy": statistics.fmean(e[1] for e in eps),
                  "questions": statistics.fmean(e[2] for e in eps), "prompts": len(eps)}
            for cue, eps in sorted(per_cue.items())}
    return {"cues": cues, "actions": dict(sorted(actions.items()))}


def cue_free_policies(task: Any, records: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """Stale digits only ({} otherwise): policy -> cue (and ``all``) -> exact mean return and questions on
    ``records``, for answering at once, asking until ``none;`` (at most three questions: the fourth round must
    answer), stopping once every digit is known (the reply names ``c``, or says ``none;``), and the oracle."""
    if not records or "cue" not in records[0]:
        return {}
    rules = task.rules

    def answer_at_once(r: dict) -> tuple[float, int]:
        return (task.correct_reward if not r["stale"] else task.wrong_reward), 0

    def ask_until_none(r: dict) -> tuple[float, int]:
        stale = len(r["stale"])
        if stale == 3:
            return task.correct_reward - 3 * rules.ask_cost, 3
        return task.correct_reward - stale * rules.ask_cost - rules.idle_ask_cost, stale + 1

    def stop_when_known(r: dict) -> tuple[float, int]:
        if "c" in r["stale"]:  # the reply that names c is the last stale digit's: everything is known
            return task.correct_reward - len(r["stale"]) * rules.ask_cost, len(r["stale"])
        return ask_until_none(r)

    def oracle(r: dict) -> tuple[float, int]:
        questions, value = task.oracle_episode(r)
        return value, questions

    table: dict[str, dict[str, dict[str, float]]] = {}
    for name, policy in (("answer at once", answer_at_once), ("ask until none", ask_until_none),
                         ("stop when known", stop_when_known), ("oracle", oracle)):
        groups: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for r in records:
            outcome = policy(r)
            groups[r["cue"]].append(outcome)
            groups["all"].append(outcome)
        table[name] = {cue: {"return": statistics.fmean(o[0] for o in outs),
                             "questions": statistics.fmean(o[1] for o in outs)} for cue, outs in sorted(groups.items())}
    return table


class DecisionLog(Callback):
    """Every epoch, per ``cue|state|action`` of the sampled segments: ``[count, advantage sum, positive, zero,
    negative]`` (the advantages the module assigned to the rows, ``row_advantages``), written to ``path`` as ``{"epochs": [{key: [...]}, ...]}``
    after each epoch (so a run cut short keeps what it logged)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.epochs: list[dict[str, list[float]]] = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        data: Any = trainer.datamodule
        report = data.epoch_report
        if report is None or not report.buffer.trees:
            return
        counts: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0])
        advantages = iter(row_advantages(report.buffer).tolist())  # rows are the trees' policy nodes, in order
        for root in report.buffer.trees:
            for node, cue, state in path_states(data.task, root):
                advantage = next(advantages)
                entry = counts[f"{cue}|{state}|{node.kind if node.kind in ACTIONS else 'malformed'}"]
                entry[0] += 1
                entry[1] += advantage
                entry[2 + (0 if advantage > 0 else 1 if advantage == 0 else 2)] += 1
        self.epochs.append({key: [round(v, 6) for v in value] for key, value in sorted(counts.items())})
        self.path.write_text(json.dumps({"epochs": self.epochs}))


def row_advantages(buffer: Any) -> Any:
    """Each row's advantage ``[N]``: the buffer's, or for per-token advantages (PPO's GAE) their mean over the row's
    counted tokens."""
    advantages = buffer.advantages
    if advantages.dim() == 1:
        return advantages
    mask = buffer.completion_mask.to(advantages.dtype)
    return (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def sampled_summary(epochs: list[dict[str, list[float]]], first: int | None = None) -> dict[str, dict[str, float]]:
    """Over ``epochs`` (the first ``first`` of them when given): per ``cue|state|action`` the sampled count, the share
    of that state's samples, the mean advantage and the shares of positive and negative advantages."""
    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0, 0])
    for epoch in epochs[:first]:
        for key, values in epoch.items():
            total[key] = [a + b for a, b in zip(total[key], values)]
    per_state: dict[str, float] = defaultdict(float)
    for key, values in total.items():
        per_state[key.rsplit("|", 1)[0]] += values[0]
    return {key: {"count": v[0], "share": v[0] / per_state[key.rsplit("|", 1)[0]], "mean_advantage": v[1] / v[0],
                  "positive": v[2] / v[0], "negative": v[4] / v[0]} for key, v in sorted(total.items()) if v[0]}
