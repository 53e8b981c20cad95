"""A risk rule that reads its own draft: draft the greedy answer, then commit it or ask.

The head of ``risk/head.py`` sees the state *before* the answer, and on the games measured it ranked errors worse
than the answer's own log-prob (docs/benchmarks.md): the errors left were slips visible in the answer's tokens.
Here the rule drafts the greedy answer at each open context, the head reads the draft (the hidden state at its last
token and its token confidences, ``draft_confidences``) and gives P(error); the rule commits the draft where
P(error) <= tau (only answer tokens allowed first, so greedy decoding writes the draft again) and asks elsewhere
(only defer tokens allowed first). The head is a logistic regression fitted on drafts labelled right or wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# contexts -> each draft's features [B, F] (the policy side computes them: policy/risk_features.draft_features)
Drafter = Callable[[list[list[int]]], torch.Tensor]


def draft_confidences(token_logprobs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per draft, from its tokens' log-probs under the policy ``[S_i]``: the sum (the draft's log-prob), the
    smallest and the first ``-> [B, 3]``. A draft of no tokens counts as certain (zeros)."""
    rows = [torch.stack([lp.sum(), lp.min(), lp[0]]) if len(lp) else torch.zeros(3) for lp in token_logprobs]
    return torch.stack(rows).float() if rows else torch.zeros(0, 3)


class LogisticHead:
    """P(error) = sigmoid(w . standardise(x) + b), fitted by L-BFGS on an L2-regularised cross-entropy.

    Args:
        l2: weight of ``|w|^2`` in the loss (the features are standardised, so one value fits every width).
    """

    def __init__(self, l2: float = 1e-2) -> None:
        self.l2 = l2
        self.mean = self.std = self.weight = self.bias = None

    def fit(self, features: torch.Tensor, errors: torch.Tensor) -> LogisticHead:
        """Fit on ``features [N, F]`` and ``errors [N]`` (True = the draft was wrong)."""
        x, y = features.double(), errors.double()
        self.mean, self.std = x.mean(0), x.std(0).nan_to_num(0.0) + 1e-6
        x = (x - self.mean) / self.std
        weight = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            logits = x @ weight + bias  # [N]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y) + self.l2 * weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
        self.weight, self.bias = weight.detach(), bias.detach()
        return self

    def p_error(self, features: torch.Tensor) -> torch.Tensor:
        """P(error) of each draft ``[N]`` (float32)."""
        if self.weight is None:
            raise RuntimeError("LogisticHead.p_error before fit")
        x = (features.double() - self.mean) / self.std
        return torch.sigmoid(x @ self.weight + self.bias).float()


class DraftRule:
    """The ``decide`` of ``expand_trees``: at every open context, the draft's P(error) picks commit or ask.

    Args:
        drafter: contexts -> the features of each context's greedy draft ``[B, F]``.
        head: anything with ``p_error(features) -> [B]`` (a fitted ``LogisticHead``).
        tau: commit where P(error) <= tau, ask elsewhere.
        defer_token_ids: the first tokens of a question (``task.defer_token_ids``).
        answer_token_ids: the first tokens of an answer (``task.answer_token_ids``).
        last_round: the round at which the draft is committed whatever its P(error) (a question there is never
            answered), or None.
    """

    def __init__(self, drafter: Drafter, head: LogisticHead, tau: float, defer_token_ids: Sequence[int],
                 answer_token_ids: Sequence[int], last_round: int | None = None) -> None:
        self.drafter, self.head, self.tau, self.last_round = drafter, head, tau, last_round
        self.defer_token_ids, self.answer_token_ids = tuple(defer_token_ids), tuple(answer_token_ids)

    def __call__(self, contexts: list[list[int]], depth: int) -> tuple[tuple[int, ...], ...]:
        if self.last_round is not None and depth >= self.last_round:
            return (self.answer_token_ids,) * len(contexts)
        p_error = self.head.p_error(self.drafter(contexts))  # [B]
        return tuple(self.defer_token_ids if p > self.tau else self.answer_token_ids for p in p_error.tolist())
