"""Sampled evaluation (docs/guide.md#sampled-evaluation): beside the greedy answer, ``n`` samples per held-out prompt
at a temperature, from the engine's seed, each scored as ``val/accuracy`` counts it (a multi-round task's: ``n``
episodes), summed up per prompt (``sample_metrics.prompt_row``) in the validation loader's batches. The greedy
figures (``evaluation.py``) are computed as without it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lit_grpo.engines import RolloutEngine, SamplingSpec
from lit_grpo.rollout.reward_worker import RewardWorker
from lit_grpo.rollout.sample_metrics import prompt_row
from lit_grpo.rollout.trees import chain_widths, expand_trees
from lit_grpo.run.seeds import derived_seed
from lit_grpo.tasks import MultiRoundTask, PromptRecord, Task
from lit_grpo.tasks.tools.episode import Episode
from lit_grpo.tree import SegmentNode


@dataclass(frozen=True)
class SampledEvaluation:
    """How a validation (and ``lit-grpo test``) samples the held-out prompts, beside decoding them greedily.

    Args:
        samples: n, the samples (episodes) drawn per prompt.
        temperature: their sampling temperature (> 0).
        top_p: nucleus sampling (0 < top_p <= 1): each token is drawn from the fewest most likely tokens whose
            probability reaches top_p, renormalised (1: the whole distribution, as training samples).
        k: the k of each ``pass@k`` reported (each 1 <= k <= samples).
        seed: the engine's seed for the draws: the same seed and policy give the same samples, so a rerun gives the
            same numbers (every validation of a run uses it: checkpoints are compared on the same draws).
        prompts: sample only the first this many of the prompts a validation (or test) reads; the greedy figures
            still cover them all (None: sample every one).
    """

    samples: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    k: list[int] = field(default_factory=lambda: [1])
    seed: int = 0
    prompts: int | None = None

    def problems(self) -> list[str]:
        problems = []
        if self.samples < 1:
            problems.append(f"evaluation.samples: must be >= 1 (samples per prompt), got {self.samples}")
        if not self.temperature > 0:
            problems.append(f"evaluation.temperature: must be > 0 (greedy alone: leave evaluation unset), "
                            f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"evaluation.top_p: must be within (0, 1] (1: the whole distribution), got {self.top_p}")
        if not self.k:
            problems.append("evaluation.k: give at least one k for pass@k, e.g. [1]")
        if self.samples >= 1 and any(not 1 <= k <= self.samples for k in self.k):
            problems.append(f"evaluation.k: each k of pass@k must be within 1..samples ({self.samples}), got "
                            f"{list(self.k)}: lower k or raise evaluation.samples")
        if self.prompts is not None and self.prompts < 1:
            problems.append(f"evaluation.prompts: must be >= 1 or None (every prompt), got {self.prompts}")
        return problems


def evaluation_problems(value: Any) -> list[str]:
    """``data.evaluation``'s problems, given as a ``SampledEvaluation``, the mapping a config holds, or None."""
    if value is None:
        return []
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(SampledEvaluation.__dataclass_fields__))
        if unknown:
            fields = ", ".join(SampledEvaluation.__dataclass_fields__)
            return [f"evaluation: unknown field(s) {', '.join(unknown)}; fields: {fields}"]
        value = SampledEvaluation(**value)
    return value.problems()


def as_evaluation(value: Any) -> SampledEvaluation | None:
    """The value of ``data.evaluation`` as its dataclass (a mapping from a config or a checkpoint), or None."""
    return SampledEvaluation(**value) if isinstance(value, dict) else value


def sampling_of(spec: SampledEvaluation, greedy: SamplingSpec, records: Sequence[PromptRecord]) -> SamplingSpec:
    """The sampling of one batch of ``records``: the greedy spec's budget and stops, ``spec``'s temperature and top-p,
    and a seed derived from ``spec.seed`` and the batch's prompts (engines seed request i with seed + i), so a rerun
    on the same batches draws the same samples."""
    seed = derived_seed(spec.seed, "evaluation", *(str(r.get("prompt")) for r in records))
    return replace(greedy, greedy=False, temperature=spec.temperature, top_p=spec.top_p, seed=seed)


def stacked(rows: list[dict[str, float]]) -> dict[str, torch.Tensor]:
    """Per-prompt rows as the batch the module accumulates: one ``[B]`` tensor per figure (float64)."""
    return {name: torch.tensor([row[name] for row in rows], dtype=torch.float64) for name in rows[0]}


def sampled_completion_scores(task: Task, engine: RolloutEngine, scorer: Task | RewardWorker, tokenizer: Any,
                              records: list[PromptRecord], sampling: SamplingSpec,
                              spec: SampledEvaluation) -> dict[str, torch.Tensor]:
    """``spec.samples`` completions per prompt, scored by ``scorer`` (the task, or its reward worker) as greedy
    evaluation scores its one: each prompt's row of figures, with ``maj@n`` over the task's extracted answers."""
    n = spec.samples
    prompt_ids = [task.prompt_ids(r, tokenizer) for r in records]
    groups = engine.generate(prompt_ids, n, sampling)
    ids = [list(completion.token_ids) for group in groups for completion in group]
    texts = [tokenizer.decode(row, skip_special_tokens=True).strip() for row in ids]
    repeated = [record for record in records for _ in range(n)]
    scored = scorer.score_group(repeated, texts, ids)
    rows = []
    for i, record in enumerate(records):
        mine = slice(i * n, (i + 1) * n)
        rows.append(prompt_row([s.reward for s in scored[mine]], [s.correct for s in scored[mine]],
                               [s.error is not None for s in scored[mine]], [len(row) for row in ids[mine]], spec.k,
                               answers=[task.answer_of(record, text) for text in texts[mine]]))
    return stacked(rows)


def sampled_episode_scores(task: MultiRoundTask, engine: RolloutEngine, tokenizer: Any, records: list[PromptRecord],
                           rounds: int | None, sampling: SamplingSpec, spec: SampledEvaluation,
                           rule: Any = None) -> dict[str, torch.Tensor]:
    """``spec.samples`` episodes per prompt of up to ``rounds`` rounds (under the risk ``rule``, if any): each
    prompt's row of figures over its episodes' returns, with turns per episode and, for a tool task, calls."""
    roots = expand_trees(task, engine, tokenizer, records, chain_widths(spec.samples, rounds), sampling, rule)
    rows = []
    for root in roots:
        chains = [chain_nodes(child) for child in root.children]
        episodes = [[n.episode for n in chain if isinstance(getattr(n, "episode", None), Episode)] for chain in chains]
        tools = any(episodes)
        rows.append(prompt_row(
            [sum(node.reward for node in chain) for chain in chains],
            [bool(getattr(chain[-1], "correct", False)) for chain in chains],
            [not getattr(chain[-1], "scorable", True) or getattr(chain[-1], "reward_error", None) is not None
             for chain in chains],
            [sum(len(node.segment) for node in chain if isinstance(node, SegmentNode)) for chain in chains],
            spec.k, turns=[sum(isinstance(n, SegmentNode) and bool(n.segment) for n in chain) for chain in chains],
            calls=[sum(mine[-1].calls.values()) if mine else 0 for mine in episodes] if tools else None))
    return stacked(rows)


def chain_nodes(first: Any) -> list[Any]:
    """The nodes of one episode (a single path from ``first`` down to its leaf)."""
    nodes = [first]
    while nodes[-1].children:
        (child,) = nodes[-1].children
        nodes.append(child)
    return nodes
