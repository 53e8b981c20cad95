"""RolloutMetrics: what each epoch's rollouts and updates looked like, in TensorBoard."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torchmetrics import MeanMetric

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.protocols import PreparesEpochs, ReportsRollouts
from lit_grpo.buffers.report import RolloutReport
from lit_grpo.buffers.tree_layout import SegmentNode
from lit_grpo.rollout.ahead import epoch_costs
from lit_grpo.tree import Node


def rollout_stats(buffer: RolloutBuffer) -> dict[str, float]:
    """Summary of one epoch's buffer: rewards, accuracy, lengths, truncation, flat groups, reward errors, KL."""
    groups = buffer.rewards.split(buffer.sizes)  # rows of each prompt's group (or tree)
    flat = torch.tensor([float(g.amax() == g.amin()) for g in groups])  # [B]
    stats = {
        "reward_mean": buffer.rewards.mean().item(),
        "reward_std": buffer.rewards.std(correction=0).item(),
        "accuracy": buffer.correct.float().mean().item(),
        "completion_length": buffer.completion_lengths.float().mean().item(),
        "policy_tokens": float(buffer.completion_mask.sum()),
        "truncated_frac": buffer.truncated.float().mean().item(),
        "zero_std_frac": flat.float().mean().item(),
        "reward_errors": float(buffer.reward_errors),
    }
    for name, values in buffer.reward_parts.items():  # each named reward over the completions it applied to
        applied = values[~values.isnan()]
        stats[f"rewards/{name}/mean"] = applied.mean().item() if applied.numel() else float("nan")
        stats[f"rewards/{name}/std"] = applied.std(correction=0).item() if applied.numel() else float("nan")
    if buffer.trees is not None:
        stats.update(tree_stats(buffer.trees))
        stats.update(round_credit(buffer.trees, buffer.tree_rounds or 0))
    if buffer.ref_logp is not None and buffer.old_logp is not None:
        # k3 of the sampled tokens, averaged over counted tokens: the KL of the sampling policy to pi_ref
        delta = (buffer.ref_logp - buffer.old_logp)[buffer.completion_mask]
        stats["kl_ref"] = (torch.exp(delta) - delta - 1).mean().item() if delta.numel() else 0.0
    return stats


def tree_stats(roots: list[Any]) -> dict[str, float]:
    """Depth reached, share of questions among segments, accuracy and mean return of the leaves, the share of
    sibling groups whose rewards-to-go are all equal (no learning signal there), and the sampled episodes behind
    each segment's advantage (the leaves below it: 1 for every segment of a chain)."""
    from lit_grpo.buffers.tree_layout import policy_nodes
    from lit_grpo.tree import depth_first, leaf_counts, leaf_returns

    segments = [node for root in roots for node in policy_nodes(root)]
    leaves = [count for root in roots for count in map(leaf_counts(root).get, policy_nodes(root))]
    answers = [node for node in segments if node.kind == "answer"]
    returns = [value for root in roots for value in leaf_returns(root)]
    sibling_groups = [node.children for root in roots for node in depth_first(root) if len(node.children) > 1]
    flat = [len({child.q for child in group}) == 1 for group in sibling_groups if group[0].q is not None]
    return {
        "tree_depth": sum(max_depth(root) for root in roots) / len(roots),
        "ask_rate": sum(node.kind == "ask" for node in segments) / max(len(segments), 1),
        "answer_accuracy": sum(node.correct for node in answers) / max(len(answers), 1),
        "mean_return": sum(returns) / max(len(returns), 1),
        "zero_variance_sibling_frac": sum(flat) / max(len(flat), 1),
        "episodes_per_decision": sum(leaves) / max(len(leaves), 1),
    }


def round_credit(roots: list[Any], rounds: int) -> dict[str, float]:
    """Per round d = 1..``rounds`` of a tree's policy rows: ``rows_round{d}``, how many rows it holds, and
    ``zero_advantage_rows_round{d}``, how many of them have advantage exactly 0 (a flat sibling group, an only
    child, a tree that is flat; or a member exactly at its group's mean): rows that carry no policy gradient but
    count in a ``seq-mean`` normaliser. Counts (summed over ranks), every round named, so every rank logs the same
    names. Empty before the advantages are assigned. Example: root -> [question -> [answer], answer], advantages
    0.5, 0 and -0.5, rounds 3: round 1 holds 2 rows, none zero; round 2 1 row, zero; round 3 none."""
    from lit_grpo.buffers.tree_layout import policy_nodes
    from lit_grpo.tree import walk

    depth_of = {id(node): len(path) for root in roots for path, node in walk(root)}
    rows = [(depth_of[id(node)], node.advantage) for root in roots for node in policy_nodes(root)]
    if any(advantage is None for _, advantage in rows):
        return {}
    stats: dict[str, float] = {}
    for depth in range(1, rounds + 1):
        at_depth = [advantage for d, advantage in rows if d == depth]
        stats[f"rows_round{depth}"] = float(len(at_depth))
        stats[f"zero_advantage_rows_round{depth}"] = float(sum(a == 0.0 for a in at_depth))
    return stats


UNKNOWN_TOOL = "unknown"  # the one key of the calls that name no declared tool (a made-up or empty name)


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
    from lit_grpo.tasks.tool_episode import Episode

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
    from lit_grpo.tasks.tool_episode import Episode

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
    (assistant turns, their calls and the tool messages) and the episode's return. Empty for other tasks."""
    leaves = tool_leaves(roots)[:max_rows]
    if not leaves:
        return ""
    lines = ["| prompt | conversation | return |", "|---|---|---|"]
    for leaf, _ in leaves:
        episode = leaf.episode
        prompt = message_text(episode.messages[episode.prompt_messages - 1])
        turns = "<br>".join(message_text(m) for m in episode.completion)
        lines.append(f"| {table_cell(prompt)} | {table_cell(turns)} | {leaf.reward:.3f} |")
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


def max_depth(node: Node) -> int:
    """Policy rounds on the deepest path below ``node`` (closing no-answer children count as no round)."""
    rounds = [max_depth(child) + (isinstance(child, SegmentNode) and bool(child.segment)) for child in node.children]
    return max(rounds, default=0)


def samples_table(buffer: RolloutBuffer, max_rows: int) -> str:
    """A markdown table of the first groups' prompts, completions, rewards and advantages."""
    lines = ["| prompt | completion | reward | advantage |", "|---|---|---|---|"]
    for row in range(min(max_rows, len(buffer.completion_texts))):
        advantage = buffer.advantages[row]
        advantage = advantage.item() if advantage.dim() == 0 else advantage[buffer.completion_mask[row]].mean().item()
        completion = buffer.completion_texts[row].replace("|", "\\|") or "(empty)"
        lines.append(
            f"| `{buffer.prompt_texts[row]}` | `{completion}` | {buffer.rewards[row].item():.3f} | {advantage:+.3f} |"
        )
    return "\n".join(lines)


def epoch_report(trainer: pl.Trainer) -> RolloutReport | None:
    """The rollout side's report of the epoch, from a DataModule that publishes one (``ReportsRollouts``)."""
    datamodule = trainer.datamodule
    return datamodule.epoch_report if isinstance(datamodule, ReportsRollouts) else None


def module_tokenizer(pl_module: Any) -> Any:
    """The module's tokenizer, to decode the rollouts' ids (None from a module that prepares no epochs)."""
    return pl_module.tokenizer if isinstance(pl_module, PreparesEpochs) else None


def print_phases(epoch: int, timings: Mapping[str, float], train: float, can_draw_ahead: bool) -> None:
    """The epoch's push, generate (with scoring) and train seconds, and what they cost in turn and drawn ahead."""
    push, generate = timings.get("push", 0.0), timings.get("generate", 0.0) + timings.get("score", 0.0)
    in_turn, ahead = epoch_costs(push, generate, train)
    waited = f", waited {timings['wait']:.2f}s for the draw ahead" if "wait" in timings else ""
    model = f"; an epoch costs {in_turn:.2f}s in turn, {ahead:.2f}s drawn ahead (data.max_staleness)"
    rank_zero_info(f"epoch {epoch} phases: push {push:.2f}s, generate {generate:.2f}s, train {train:.2f}s{waited}"
                   + (model if can_draw_ahead else ""))


class RolloutMetrics(pl.Callback):
    """Logs ``rollout/*`` once per epoch from the buffer, ``train/*`` epoch means of the loss stats, and ``time/*``:
    seconds spent generating, scoring, in the no-grad passes and in the updates.

    Args:
        table_every_n_epochs: write a text table of sample completions every N epochs (0 turns it off).
        table_rows: completions in that table.
    """

    TRAIN_KEYS = (
        "surrogate", "kl_ref", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean",
        "clip_ratio/delta_mean", "ratio_mean",
        "approx_kl", "cispo_clip_ratio", "sapo/gate_mean", "vespo/phi_seq_mean", "off_policy_mask/masked_ratio",
        "entropy", "entropy_coef", "sampling/importance_sampling_ratio/mean", "sampling/importance_sampling_ratio/min",
        "sampling/importance_sampling_ratio/max", "sampling/importance_sampling_ratio/masked_ratio", "value_loss", "explained_variance", "value_mean",
        "dpo_reward_margin", "dpo_accuracy",
    )

    def __init__(self, table_every_n_epochs: int = 5, table_rows: int = 16) -> None:
        self.table_every_n_epochs = table_every_n_epochs
        self.table_rows = table_rows
        self.train = {key: MeanMetric() for key in self.TRAIN_KEYS}
        self._train_started: float | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:  # the module has prepared the epoch's buffer (its on_train_epoch_start)
            self.log_rollouts(trainer, pl_module)

    def log_rollouts(self, trainer: pl.Trainer, pl_module: Any) -> None:
        report = epoch_report(trainer)
        if report is None:
            return
        buffer = report.buffer
        stats = rollout_stats(buffer)
        if report.sampling_draws is not None:  # dynamic sampling
            stats["sampling_draws"] = float(report.sampling_draws)
        if report.staleness is not None:  # versions between the adapter that drew and the one that trains
            stats["staleness"] = float(report.staleness)
        stats.update(report.engine_metrics)  # e.g. the vllm_server engine's servers_alive
        if buffer.trees is not None:  # the same on every rank (the rollout kind), as the gathering needs
            stats.update(global_tool_stats(buffer.trees, trainer.strategy, trainer.world_size))
        # over ranks: counts add up, the rest are means of equal shares; tools/* are already global (equal on every
        # rank, so their mean is themselves)
        for name, value in stats.items():
            reduce = "sum" if name in ("policy_tokens", "reward_errors") or "rows_round" in name else "mean"
            key = name if name.startswith("tools/") else f"rollout/{name}"  # TRL's names for the tool figures
            pl_module.log(key, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx=reduce,
                          batch_size=1)
        prepared = pl_module.preparation_timings if isinstance(pl_module, PreparesEpochs) else {}
        for name, seconds in {**report.timings, **prepared}.items():
            pl_module.log(f"time/{name}", seconds, on_step=False, on_epoch=True, sync_dist=True, batch_size=1)
        self._train_started = time.perf_counter()
        every = self.table_every_n_epochs
        if every and trainer.current_epoch % every == 0:
            self.write_table(trainer, buffer)
            if buffer.trees:
                self.write_tree(trainer, buffer.trees[0], module_tokenizer(pl_module))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        stats = outputs.get("stats", {}) if isinstance(outputs, dict) else {}
        for key in self.TRAIN_KEYS:
            if key in stats:
                self.train[key] = self.train[key].to(pl_module.device)
                self.train[key].update(stats[key])
        for key, reduce in (("logp_diff_max", "max"), ("logp_diff_mean", "mean")):  # the worst rank's max
            if key in stats:
                pl_module.log(f"rollout/{key}", stats[key], on_step=False, on_epoch=True, sync_dist=True, batch_size=1,
                              reduce_fx=reduce)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._train_started is not None:  # the updates' share of the epoch, beside generate and no-grad passes
            train = time.perf_counter() - self._train_started
            pl_module.log("time/train", train, on_step=False, on_epoch=True, sync_dist=True)
            self._train_started = None
            report = epoch_report(trainer)  # the cost of drawing ahead is shown only where it could run
            if report is not None:
                print_phases(trainer.current_epoch, report.timings, train, report.can_draw_ahead)
        for key in self.TRAIN_KEYS:
            metric = self.train[key]
            if metric.update_count:
                pl_module.log(f"train/{key}", metric.compute(), on_step=False, on_epoch=True, sync_dist=True)
            metric.reset()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """A sampled tree of the epoch's rollouts beside each validation's greedy scores."""
        report = epoch_report(trainer)
        if not trainer.sanity_checking and report is not None and report.buffer.trees:
            self.write_tree(trainer, report.buffer.trees[0], module_tokenizer(pl_module))

    @rank_zero_only
    def write_tree(self, trainer: pl.Trainer, root: SegmentNode, tokenizer: Any = None) -> None:
        """One tree as indented text: each node's reward, value, q and advantage, and its segment and the
        environment's reply when a tokenizer is given."""
        from lit_grpo.tree import render_tree

        def label(node: Node) -> str:
            if not isinstance(node, SegmentNode) or not node.segment:
                return ""
            segment = tokenizer.decode(list(node.segment), skip_special_tokens=True)
            reply = tokenizer.decode(list(node.reply), skip_special_tokens=True)
            return f"{segment!r}" + (f" -> {reply!r}" if reply else "")

        logger = trainer.logger
        if logger is not None and hasattr(logger.experiment, "add_text"):
            tree = render_tree(root, label if tokenizer is not None else None)
            text = f"prompt `{root.record.get('prompt', '')}`\n\n```\n{tree}\n```"
            logger.experiment.add_text("tree/sample", text, trainer.global_step)

    @rank_zero_only
    def write_table(self, trainer: pl.Trainer, buffer: RolloutBuffer) -> None:
        logger = trainer.logger
        if logger is not None and hasattr(logger.experiment, "add_text"):
            logger.experiment.add_text("rollout/samples", samples_table(buffer, self.table_rows), trainer.global_step)
            conversations = conversations_table(list(buffer.trees or []), self.table_rows)
            if conversations:  # a tool task's episodes, whole
                logger.experiment.add_text("rollout/conversations", conversations, trainer.global_step)
