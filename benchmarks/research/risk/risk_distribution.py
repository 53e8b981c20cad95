"""Atoms or quantiles for the risk head? Both fitted on the same frozen features and labels, measured on held-out
decision states (issue 21).

Per seed: train ``configs/hidden_risk.yaml`` as benchmarks/research/risk/risk.py does; take the replay the head was
fitted on (its training labels) and label the 500 held-out prompts the same way (greedy probes: plain, forced question,
forced answer); compute the final policy's decision features once. Then fit each variant with the same budget
(full-batch Adam, the config's 200 steps, the learning rate picked from the same three by held-back CRPS on a
quarter of the replay, then refitted on all of it): a categorical over 11, 26 (the config's) and 51 atoms on
[-1.5, 1] with the two-hot cross-entropy, and 11, 26 and 51 quantiles with the quantile (pinball) loss. Both are
read as the same thing, a discrete distribution (values and probabilities), so every metric is one function:
CRPS of each branch, the Brier score and AUROC of P(error) on the answering branch, and the regret of the value
rule (answer iff E[answer] >= E[ask]) where both branches were observed. Rows go to
``benchmarks/results/risk_distribution.jsonl`` (finished seeds skipped on re-run).

    .venv/bin/python benchmarks/research/risk/risk_distribution.py [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from lit_grpo.engines import SamplingSpec  # noqa: E402
from lit_grpo.risk.head import DEFER, INFER, risk_loss  # noqa: E402
from lit_grpo.rollout.probes import probe_labels
from lit_grpo.policy.risk_features import context_features
from lit_grpo.risk.selective import auroc, brier  # noqa: E402
from benchmarks.result_rows import append_row, read_rows  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "risk_distribution.jsonl"
V_MIN, V_MAX, STEPS, LRS = -1.5, 1.0, 200, (0.01, 0.05, 0.2)
VARIANTS = (("atoms", 11), ("atoms", 26), ("atoms", 51), ("quantiles", 11), ("quantiles", 26), ("quantiles", 51))
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776}


def crps(values: torch.Tensor, probs: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """CRPS of discrete distributions (``values [M, K]`` with ``probs [M, K]``) at ``outcomes [M]``:
    E|X - y| - E|X - X'| / 2 ``[M]`` (lower is better; 0 for a point mass on the outcome).

    Example: values [-1, 1], probs [1/2, 1/2], y = 1: E|X - y| = 1, E|X - X'| = 1 -> 0.5.
    """
    spread = (values.unsqueeze(-1) - values.unsqueeze(-2)).abs()  # [M, K, K]
    pairwise = (probs.unsqueeze(-1) * probs.unsqueeze(-2) * spread).sum((-1, -2))  # [M]
    return (probs * (values - outcomes.unsqueeze(-1)).abs()).sum(-1) - pairwise / 2


def quantile_levels(count: int) -> torch.Tensor:
    """The midpoints (2k - 1) / 2K of K equal-mass bins ``[K]``, the levels QR-DQN regresses."""
    return (torch.arange(count, dtype=torch.float32) + 0.5) / count


def pinball_loss(quantiles: torch.Tensor, outcomes: torch.Tensor) -> torch.Tensor:
    """Mean quantile loss of ``quantiles [M, K]`` (at ``quantile_levels(K)``) against ``outcomes [M]``.

    Example: K = 2 (levels 1/4, 3/4), quantiles [0, 0], y = 1: (1/4 * 1 + 3/4 * 1) / 2 = 0.5; y = -1: same 0.5.
    """
    levels = quantile_levels(quantiles.shape[-1]).to(quantiles)  # [K]
    gap = outcomes.unsqueeze(-1) - quantiles  # [M, K]
    return torch.maximum(levels * gap, (levels - 1) * gap).mean()


class Variant:
    """A linear two-branch head ``[M, F] -> [M, 2, K]`` read as atoms (logits over fixed values) or quantiles."""

    def __init__(self, kind: str, count: int, width: int) -> None:
        self.kind, self.count = kind, count
        self.linear = torch.nn.Linear(width, 2 * count)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.atoms = torch.linspace(V_MIN, V_MAX, count)

    def distribution(self, features: torch.Tensor, branch: int) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.linear(features).unflatten(-1, (2, self.count))[:, branch]  # [M, K]
        if self.kind == "atoms":
            return self.atoms.expand_as(out), out.softmax(-1)
        return out, torch.full_like(out, 1 / self.count)

    def loss(self, features: torch.Tensor, returns: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        total = features.new_tensor(0.0)
        out = self.linear(features).unflatten(-1, (2, self.count))  # [M, 2, K]
        for branch, observed in zip((INFER, DEFER), returns):
            seen = ~observed.isnan()
            if self.kind == "atoms":
                total = total + risk_loss(out[seen, branch], observed[seen], self.atoms)
            elif seen.any():
                total = total + pinball_loss(out[seen, branch], observed[seen])
        return total

    def fit(self, features: torch.Tensor, returns: tuple[torch.Tensor, torch.Tensor], lr: float) -> None:
        optimizer = torch.optim.Adam(self.linear.parameters(), lr=lr)
        for _ in range(STEPS):
            optimizer.zero_grad()
            self.loss(features, returns).backward()
            optimizer.step()


@torch.no_grad()
def metrics(variant: Variant, features: torch.Tensor, returns: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    out: dict[str, float] = {}
    expected = []
    for name, branch, observed in (("answer", INFER, returns[0]), ("ask", DEFER, returns[1])):
        values, probs = variant.distribution(features, branch)
        seen = ~observed.isnan()
        out[f"crps_{name}"] = float(crps(values[seen], probs[seen], observed[seen]).mean())
        expected.append((values * probs).sum(-1))
        if branch == INFER:
            p_error = (probs * (values < 0).float()).sum(-1)[seen]
            errors = observed[seen] < 0
            out["brier"], out["auroc"] = brier(p_error, errors), auroc(p_error, errors)
    both = ~returns[0].isnan() & ~returns[1].isnan()
    chosen = torch.where(expected[0] >= expected[1], returns[0], returns[1])[both]
    out["regret"] = float((torch.maximum(returns[0], returns[1])[both] - chosen).mean())
    return out


def tuned(kind: str, count: int, features: torch.Tensor, returns: tuple[torch.Tensor, torch.Tensor],
          seed: int) -> tuple[Variant, float]:
    """The variant refitted on every row with the learning rate whose fit on three quarters of the rows gave the
    lowest CRPS (both branches summed) on the last quarter."""
    order = torch.randperm(len(features), generator=torch.Generator().manual_seed(seed))
    fit_rows, held = order[: len(order) * 3 // 4], order[len(order) * 3 // 4:]

    def held_crps(lr: float) -> float:
        variant = Variant(kind, count, features.shape[1])
        variant.fit(features[fit_rows], tuple(r[fit_rows] for r in returns), lr)
        scores = metrics(variant, features[held], tuple(r[held] for r in returns))
        return scores["crps_answer"] + scores["crps_ask"]

    best = min(LRS, key=held_crps)
    variant = Variant(kind, count, features.shape[1])
    variant.fit(features, returns, best)
    return variant, best


def measure(seed: int) -> dict:
    from benchmarks.research.risk.risk import train  # the same policy and head risk.py measures

    cli = train(seed)
    module, datamodule = cli.model, cli.datamodule
    task, engine, tokenizer = datamodule.task, datamodule.engine, module.tokenizer
    datamodule.sync_policy(module)
    module.policy.eval()
    spec = SamplingSpec(max_new_tokens=datamodule.max_new_tokens, greedy=True, stop_token_ids=module.stop_token_ids)
    train_labels = module.risk_replay.labels()
    held_labels = probe_labels(task, engine, tokenizer, list(task.heldout_records())[:500], 3, spec)
    pad = tokenizer.pad_token_id
    train_x = context_features(module.policy, train_labels.contexts, pad)
    held_x = context_features(module.policy, held_labels.contexts, pad)
    train_y = (train_labels.infer_returns, train_labels.defer_returns)
    held_y = (held_labels.infer_returns, held_labels.defer_returns)
    row: dict = {"seed": seed, "train_rows": len(train_x), "held_rows": len(held_x),
                 "held_answer_rows": int((~held_y[0].isnan()).sum()), "held_ask_rows": int((~held_y[1].isnan()).sum()),
                 "held_errors": int((held_y[0] < 0).sum()), "variants": {}}
    for kind, count in VARIANTS:
        variant, lr = tuned(kind, count, train_x, train_y, seed)
        row["variants"][f"{kind} {count}"] = {"lr": lr, **metrics(variant, held_x, held_y)}
    engine.close()
    return row


def mean_ci(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if len(values) < 2:
        return f"{values[0]:.4f}" if values else "—"
    half = T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return f"{statistics.mean(values):.4f} ± {half:.4f}"


def report(rows: list[dict]) -> None:
    names = list(rows[0]["variants"])
    keys = ("crps_answer", "crps_ask", "brier", "auroc", "regret")
    print(f"{len(rows)} seeds; held-out rows per seed: " + ", ".join(
        f"{r['held_rows']} ({r['held_answer_rows']} answer, {r['held_ask_rows']} ask, {r['held_errors']} errors)"
        for r in rows))
    print("| head | " + " | ".join(keys) + " | lr picked |")
    print("|---" * (len(keys) + 2) + "|")
    for name in names:
        cells = [mean_ci([r["variants"][name][k] for r in rows]) for k in keys]
        lrs = ", ".join(f"{r['variants'][name]['lr']:g}" for r in rows)
        print(f"| {name} | " + " | ".join(cells) + f" | {lrs} |")
    reference = "atoms 26"
    print(f"\npaired differences against {reference} (mean ± 95% t over seeds; negative = lower than {reference}):")
    for name in names:
        if name != reference:
            cells = [mean_ci([r["variants"][name][k] - r["variants"][reference][k] for r in rows]) for k in keys]
            print(f"| {name} − {reference} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    options = parser.parse_args()
    done = {row["seed"] for row in read_rows(RESULTS)}
    for seed in options.seeds:
        if seed in done:
            continue
        row = measure(seed)
        append_row(RESULTS, row)
        print(f"seed {seed} done", flush=True)
    rows = read_rows(RESULTS)
    report([r for r in rows if r["seed"] in options.seeds])


if __name__ == "__main__":
    main()
