"""The signals and rules benchmarks/research/risk/risk.py compares: every answer decision of greedy held-out episodes
with the head's P(error) and the baselines' scores (higher = an error is likelier), and greedy play under each rule."""

from __future__ import annotations

import math
from typing import Any

import torch

from lit_grpo.engines import SamplingSpec
from lit_grpo.policy.risk_features import context_error_probability, context_hidden_states
from lit_grpo.tree import depth_first
from lit_grpo.rollout.trees import greedy_trees

BASELINES = ("first_token_prob", "first_token_entropy", "seq_logprob", "min_token_prob", "agreement_8", "probe",
             "info_hidden")


def answer_decisions(task: Any, engine: Any, tokenizer: Any, records: list, rounds: int, spec: SamplingSpec) -> list:
    """The decision each greedy episode ended with, where the policy answered (or wrote a malformed segment):
    ``{context, segment, error, informed, record}``; informed: it had asked as often as operands were hidden."""
    decisions = []
    for record, root in zip(records, greedy_trees(task, engine, tokenizer, records, rounds, spec)):
        path = depth_first(root)[1:]
        last = path[-1]
        if not getattr(last, "segment", ()) or last.kind == "ask":
            continue  # cut off after a question: no answer decision
        asked = sum(getattr(node, "kind", "") == "ask" for node in path)
        decisions.append({"context": list(last.context), "segment": list(last.segment), "error": last.reward < 0,
                          "informed": asked >= task.oracle_questions(record), "record": record})
    return decisions


@torch.no_grad()
def token_signals(policy: Any, decisions: list, pad_id: int) -> dict[str, torch.Tensor]:
    """From the policy's probabilities of the greedy answer's tokens: 1 - first-token probability, first-token
    entropy, minus the sequence log-prob, 1 - the smallest token probability ``[M]`` each."""
    policy.eval()
    rows = [d["context"] + d["segment"] for d in decisions]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    mask = torch.arange(width) < torch.tensor([len(r) for r in rows]).unsqueeze(1)  # [M, L]
    logp = torch.cat([policy(input_ids=ids[i:i + 128], attention_mask=mask[i:i + 128].long()).logits.float()
                      .log_softmax(-1) for i in range(0, len(rows), 128)])  # [M, L, V] (tiny vocabulary)
    out = {name: torch.zeros(len(rows)) for name in ("first_token_prob", "first_token_entropy", "seq_logprob",
                                                     "min_token_prob")}
    for i, d in enumerate(decisions):
        start, segment = len(d["context"]), torch.tensor(d["segment"])
        step = logp[i, start - 1 : start - 1 + len(segment)]  # [S, V] position t predicts token t + 1
        token_logp = step.gather(1, segment.unsqueeze(1)).squeeze(1)  # [S]
        out["first_token_prob"][i] = 1 - token_logp[0].exp()
        out["first_token_entropy"][i] = -(step[0].exp() * step[0]).sum()
        out["seq_logprob"][i] = -token_logp.sum()
        out["min_token_prob"][i] = 1 - token_logp.exp().min()
    return out


def agreement(engine: Any, tokenizer: Any, decisions: list, spec: SamplingSpec, samples: int = 8) -> torch.Tensor:
    """1 - the share of ``samples`` answers sampled at temperature 1 from the decision's context that equal the
    greedy answer ``[M]`` (seeded per request)."""
    groups = engine.generate([d["context"] for d in decisions], samples, spec)
    scores = []
    for d, group in zip(decisions, groups):
        greedy = tokenizer.decode(d["segment"], skip_special_tokens=True).strip()
        same = sum(tokenizer.decode(list(c.token_ids), skip_special_tokens=True).strip() == greedy for c in group)
        scores.append(1 - same / samples)
    return torch.tensor(scores)


def logistic_probe(features: torch.Tensor, errors: torch.Tensor, seed: int, folds: int = 2,
                   l2: float = 1e-2) -> torch.Tensor:
    """Cross-fitted P(error) of an L2-regularised logistic regression on frozen ``features [M, H]``: each fold is
    scored by a probe fitted on the others (standardised features, L-BFGS)."""
    order = torch.randperm(len(errors), generator=torch.Generator().manual_seed(seed))
    scores = torch.zeros(len(errors))
    for part in order.tensor_split(folds):
        train = torch.ones(len(errors), dtype=torch.bool)
        train[part] = False
        x, y = features[train].double(), errors[train].double()
        mean, std = x.mean(0), x.std(0) + 1e-6
        x = (x - mean) / std
        weight = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ weight + bias, y) + l2 * weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            scores[part] = torch.sigmoid(((features[part].double() - mean) / std) @ weight + bias).float()
    return scores


def decision_scores(module: Any, engine: Any, task: Any, decisions: list, spec: SamplingSpec, seed: int) -> dict:
    """Every signal at every decision: the head's P(error) and each baseline's score ``[M]``."""
    tokenizer, pad = module.tokenizer, module.tokenizer.pad_token_id
    contexts = [d["context"] for d in decisions]
    errors = torch.tensor([d["error"] for d in decisions])
    features = context_hidden_states(module.policy, contexts, pad)  # [M, H]
    scores = {"head": context_error_probability(module.policy, module.risk_head, contexts, pad)}
    scores.update(token_signals(module.policy, decisions, pad))
    sampled = SamplingSpec(max_new_tokens=spec.max_new_tokens, temperature=1.0, seed=seed,
                           stop_token_ids=spec.stop_token_ids)
    scores["agreement_8"] = agreement(engine, tokenizer, decisions, sampled)
    scores["probe"] = logistic_probe(features, errors, seed)
    scores["info_hidden"] = torch.tensor([float(not d["informed"]) for d in decisions])
    return scores


class LogProbRule:
    """Defer where the policy would answer but the probability of its likeliest first token is below ``theta``."""

    def __init__(self, policy: Any, defer_ids: list[int], pad_id: int, theta: float) -> None:
        self.policy, self.defer_ids, self.pad_id, self.theta = policy, tuple(defer_ids), pad_id, theta

    @torch.no_grad()
    def __call__(self, contexts: list[list[int]], depth: int) -> list:
        hidden = context_hidden_states(self.policy, contexts, self.pad_id)  # [B, H]
        head = self.policy.get_output_embeddings()
        probs = head(hidden.to(head.weight.dtype)).float().softmax(-1)  # [B, V]
        top, token = probs.max(-1)
        return [self.defer_ids if int(t) not in self.defer_ids and float(p) < self.theta else None
                for p, t in zip(top, token)]


def play(task: Any, engine: Any, tokenizer: Any, records: list, rounds: int, spec: SamplingSpec,
         decide: Any = None) -> dict[str, float]:
    """Greedy episodes under ``decide``: mean return, questions per episode, accuracy."""
    roots = greedy_trees(task, engine, tokenizer, records, rounds, spec, decide)
    returns, asks, right = [], [], []
    for root in roots:
        path = depth_first(root)[1:]
        returns.append(sum(node.reward for node in path))
        asks.append(sum(getattr(node, "kind", "") == "ask" for node in path))
        right.append(bool(getattr(path[-1], "correct", False)))
    count = len(roots)
    return {"return": sum(returns) / count, "ask_rate": sum(asks) / count, "accuracy": sum(right) / count}


def finite(value: float) -> float | None:
    return None if math.isnan(value) else value
