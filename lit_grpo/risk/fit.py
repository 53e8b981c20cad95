"""Fitting the detached risk head: a replay of labelled decision states and a full-batch fit on frozen features."""

from __future__ import annotations

import torch

from lit_grpo.risk.head import DEFER, INFER, RiskHead, risk_loss
from lit_grpo.risk.probes import ProbeLabels


def branch_loss(logits: torch.Tensor, infer_returns: torch.Tensor, defer_returns: torch.Tensor,
                atoms: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the head's two branches ``logits [M, 2, K]`` against the returns observed on each
    ``[M]`` (NaN: not observed), each branch averaged over its own labelled rows, the two summed."""
    total = logits.new_tensor(0.0)
    for branch, returns in ((INFER, infer_returns), (DEFER, defer_returns)):
        seen = ~returns.isnan()  # [M]
        total = total + risk_loss(logits[seen, branch], returns[seen], atoms)
    return total


def fit_head(head: RiskHead, features: torch.Tensor, infer_returns: torch.Tensor, defer_returns: torch.Tensor,
             steps: int, lr: float) -> float:
    """``steps`` full-batch Adam steps of the head on fixed ``features [M, H]`` (from its current weights, so
    epochs warm-start); returns the final loss."""
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    with torch.enable_grad():
        for _ in range(steps):
            optimizer.zero_grad()
            loss = branch_loss(head(features), infer_returns, defer_returns, head.atoms)
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return float(branch_loss(head(features), infer_returns, defer_returns, head.atoms))


class RiskReplay:
    """The most recent ``size`` labelled decision states, oldest first (a state labelled again in a later epoch is
    a new row: its label may differ, and the newer policy's is the likelier)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows: list[tuple[tuple[int, ...], float, float]] = []

    def add(self, labels: ProbeLabels) -> None:
        self.rows += zip(labels.contexts, labels.infer_returns.tolist(), labels.defer_returns.tolist())
        del self.rows[: max(0, len(self.rows) - self.size)]

    def labels(self) -> ProbeLabels:
        values = torch.tensor([(i, d) for _, i, d in self.rows], dtype=torch.float32).reshape(-1, 2)  # [M, 2]
        return ProbeLabels([c for c, _, _ in self.rows], values[:, 0], values[:, 1])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors only (checkpoints load with ``weights_only=True``): contexts flattened with their lengths."""
        labels = self.labels()
        flat = [token for context in labels.contexts for token in context]
        return {"tokens": torch.tensor(flat, dtype=torch.long),
                "lengths": torch.tensor([len(c) for c in labels.contexts], dtype=torch.long),
                "infer": labels.infer_returns, "defer": labels.defer_returns}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        contexts = [tuple(part.tolist()) for part in state["tokens"].split(state["lengths"].tolist())]
        self.rows = []
        self.add(ProbeLabels(contexts, state["infer"], state["defer"]))
