"""RolloutMetrics: what each epoch's rollouts and updates looked like, in TensorBoard."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from torchmetrics import MeanMetric

from lit_grpo.buffers.buffer import RolloutBuffer
from lit_grpo.buffers.protocols import PreparesEpochs, ReportsRollouts
from lit_grpo.buffers.report import RolloutReport
from lit_grpo.callbacks.episode_metrics import conversations_table, episode_stats
from lit_grpo.callbacks.evaluations import append_evaluation
from lit_grpo.rollout.ahead import epoch_costs
from lit_grpo.tree import Node, SegmentNode


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
    from lit_grpo.tree import depth_first, leaf_counts, leaf_returns, policy_nodes

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
    from lit_grpo.tree import policy_nodes, walk

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
        evaluations_file: append each validation's and test's figures to ``<log_dir>/evaluations.jsonl``, one JSON
            object per figure (``callbacks/evaluations.py``; docs/guide.md#evaluating-the-base-model-and-an-adapter).
        evaluation_images: with the evaluations file, draw each evaluation in TensorBoard: pass@k against k, and
            within fit each figure over the steps against the base model's line (docs/guide.md#pictures-of-evaluations).
    """

    # the training step's figures of the sampler against the trainer, logged under rollout/ (the worst rank's max);
    # every other figure the step returns is logged as train/<name>, its epoch mean
    ROLLOUT_KEYS = {"logp_diff_max": "max", "logp_diff_mean": "mean"}

    def __init__(self, table_every_n_epochs: int = 5, table_rows: int = 16, evaluations_file: bool = True,
                 evaluation_images: bool = True) -> None:
        self.table_every_n_epochs = table_every_n_epochs
        self.table_rows = table_rows
        self.evaluations_file, self.evaluation_images = evaluations_file, evaluation_images
        self._checkpoint_step: int | None = None  # the step of the checkpoint a validate / test loaded
        self.train: dict[str, MeanMetric] = {}  # one epoch mean per figure the training steps return
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
            stats.update(episode_stats(buffer.trees, report.logged_metrics, trainer.strategy, trainer.world_size,
                                       report.tool_names))
        # over ranks: counts add up, the rest are means of equal shares; tools/* and a tool task's rewards/* and
        # logged/* are already global (equal on every rank, so their mean is themselves)
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
        for key, value in stats.items():
            if key in self.ROLLOUT_KEYS:
                pl_module.log(f"rollout/{key}", value, on_step=False, on_epoch=True, sync_dist=True, batch_size=1,
                              reduce_fx=self.ROLLOUT_KEYS[key])
                continue
            metric = self.train[key] if key in self.train else MeanMetric()
            self.train[key] = metric.to(pl_module.device)
            self.train[key].update(value)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self._train_started is not None:  # the updates' share of the epoch, beside generate and no-grad passes
            train = time.perf_counter() - self._train_started
            pl_module.log("time/train", train, on_step=False, on_epoch=True, sync_dist=True)
            self._train_started = None
            report = epoch_report(trainer)  # the cost of drawing ahead is shown only where it could run
            if report is not None:
                print_phases(trainer.current_epoch, report.timings, train, report.can_draw_ahead)
        for key, metric in sorted(self.train.items()):  # in one order on every rank (each logs with sync_dist)
            if metric.update_count:
                pl_module.log(f"train/{key}", metric.compute(), on_step=False, on_epoch=True, sync_dist=True)
            metric.reset()

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        """A sampled tree of the epoch's rollouts beside each validation's greedy scores."""
        report = epoch_report(trainer)
        if not trainer.sanity_checking and report is not None and report.buffer.trees:
            self.write_tree(trainer, report.buffer.trees[0], module_tokenizer(pl_module))

    def setup(self, trainer: pl.Trainer, pl_module: Any, stage: str) -> None:
        self._checkpoint_step = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.evaluations_file and trainer.enable_validation and trainer.current_epoch == trainer.global_step == 0:
            # the module's on_train_start measured the policy before training: the file's step 0
            append_evaluation(trainer, pl_module, "val", None, self.evaluation_images)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step")  # what a validate / test of a checkpoint names as its step
        self._checkpoint_step = int(step) if isinstance(step, int) else None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.evaluations_file and not trainer.sanity_checking:
            append_evaluation(trainer, pl_module, "val", self._checkpoint_step, self.evaluation_images)

    def on_test_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if self.evaluations_file:
            append_evaluation(trainer, pl_module, "test", self._checkpoint_step, self.evaluation_images)

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
