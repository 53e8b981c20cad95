"""The tables and figures of benchmarks/research/risk/risk.py from its per-seed rows (decision-level scores kept in the
rows, so the report, the bootstrap and the Learn-then-Test re-splits re-run without training)."""

from __future__ import annotations

import statistics
from pathlib import Path

import torch

from lit_grpo.risk.head import expected_calibration_error, learn_then_test, reliability_bins
from lit_grpo.risk.selective import auroc, aurc, brier, excess_aurc, risk_coverage, selective_risk_at

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
SIGNALS = ("head", "probe", "first_token_prob", "first_token_entropy", "seq_logprob", "min_token_prob",
           "agreement_8", "info_hidden")
TAUS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
BOOTSTRAP, RESPLITS = 1000, 200


def mean_ci(values: list[float]) -> str:
    values = [v for v in values if v == v]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    half = T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5
    return f"{statistics.mean(values):.3f} ± {half:.3f}"


def tensors(row: dict, subset: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    keep = torch.tensor(row["informed"]) if subset == "informed" else torch.ones(len(row["errors"]), dtype=torch.bool)
    scores = {name: torch.tensor(values, dtype=torch.float64)[keep] for name, values in row["scores"].items()}
    return scores, torch.tensor(row["errors"])[keep]


def signal_metrics(scores: torch.Tensor, errors: torch.Tensor) -> dict[str, float]:
    return {"AUROC": auroc(scores, errors), "AURC": aurc(scores, errors), "E-AURC": excess_aurc(scores, errors),
            "sel. error @0.8": selective_risk_at(scores, errors, 0.8),
            "sel. error @0.9": selective_risk_at(scores, errors, 0.9)}


def signal_table(rows: list[dict], subset: str) -> dict[str, dict[str, list[float]]]:
    table: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        scores, errors = tensors(row, subset)
        for name in SIGNALS:
            for metric, value in signal_metrics(scores[name], errors).items():
                table.setdefault(name, {}).setdefault(metric, []).append(value)
    return table


def print_signal_table(rows: list[dict], subset: str, what: str) -> dict[str, dict[str, list[float]]]:
    """Print every signal's metrics over seeds in ``subset`` ("all" or "informed") of the ``what``; return them."""
    table = signal_table(rows, subset)
    print(f"\n### {subset} {what} (mean ± 95% t over seeds)\n")
    print("| signal | AUROC | AURC | E-AURC | sel. error @0.8 | sel. error @0.9 |\n|---|---|---|---|---|---|")
    for name in SIGNALS:
        print(f"| {name} | " + " | ".join(mean_ci(table[name][m]) for m in table[name]) + " |")
    return table


def paired_auroc_gap(rows: list[dict], rival: str, seed: int = 0) -> tuple[float, float, float]:
    """Mean over seeds of AUROC(head) - AUROC(rival) in informed states, and its 95% stratified paired bootstrap
    interval (decisions resampled within each seed, the same resample for both signals)."""
    generator = torch.Generator().manual_seed(seed)
    data = [tensors(row, "informed") for row in rows]
    point = statistics.mean(auroc(s["head"], e) - auroc(s[rival], e) for s, e in data)
    gaps = []
    for _ in range(BOOTSTRAP):
        per_seed = []
        for scores, errors in data:
            pick = torch.randint(len(errors), (len(errors),), generator=generator)
            per_seed.append(auroc(scores["head"][pick], errors[pick]) - auroc(scores[rival][pick], errors[pick]))
        gaps.append(statistics.mean(per_seed))
    gaps = sorted(g for g in gaps if g == g)
    return point, gaps[int(0.025 * len(gaps))], gaps[int(0.975 * len(gaps)) - 1]


def ltt_resplits(rows: list[dict], alpha: float, delta: float) -> dict[str, float]:
    """Learn-then-Test on a random half of each seed's decisions, the chosen tau's selective error on the other
    half, ``RESPLITS`` times per seed: the share of splits where it held (<= alpha), always-defer ones apart."""
    held, deferred, coverage, total = 0, 0, [], 0
    generator = torch.Generator().manual_seed(0)
    for row in rows:
        p_error, errors = torch.tensor(row["scores"]["head"]), torch.tensor(row["errors"])
        for _ in range(RESPLITS):
            order = torch.randperm(len(errors), generator=generator)
            calibration, test = order[: len(order) // 2], order[len(order) // 2:]
            curve = [(t, int((errors[calibration] & (p_error[calibration] <= t)).sum()),
                      int((p_error[calibration] <= t).sum())) for t in TAUS]
            tau, _ = learn_then_test(curve, alpha, delta)
            total += 1
            if tau is None:
                deferred += 1
                held += 1  # answering nothing makes no error: the guarantee holds vacuously
                continue
            covered = p_error[test] <= tau
            coverage.append(float(covered.float().mean()))
            held += int(covered.sum() == 0 or float((errors[test] & covered).sum()) / int(covered.sum()) <= alpha)
    return {"held": held / total, "always_defer": deferred / total,
            "coverage": statistics.mean(coverage) if coverage else 0.0, "splits": total}


def report(rows: list[dict], alpha: float, delta: float, docs: Path) -> None:
    rows = sorted(rows, key=lambda r: r["seed"])
    print(f"\n{len(rows)} seeds {[r['seed'] for r in rows]}; decisions per seed "
          f"{[len(r['errors']) for r in rows]}, errors {[sum(r['errors']) for r in rows]}, informed "
          f"{[sum(r['informed']) for r in rows]}, errors among informed "
          f"{[sum(e and i for e, i in zip(r['errors'], r['informed'])) for r in rows]}")
    best = {}
    for subset in ("all", "informed"):
        table = print_signal_table(rows, subset, "answer decisions")
        rivals = [n for n in SIGNALS if n != "head"]
        best[subset] = max(rivals, key=lambda n: statistics.mean(v for v in table[n]["AUROC"] if v == v)
                           if any(v == v for v in table[n]["AUROC"]) else -1)
        best_eaurc = statistics.mean(table[best[subset]]["E-AURC"])
        print(f"\nbest baseline by AUROC: {best[subset]}; head E-AURC / its E-AURC = "
              f"{statistics.mean(table['head']['E-AURC']) / best_eaurc:.2f}")
    point, low, high = paired_auroc_gap(rows, best["informed"])
    print(f"\ninformed states: AUROC(head) - AUROC({best['informed']}) = {point:+.3f}, 95% paired bootstrap "
          f"[{low:+.3f}, {high:+.3f}] ({BOOTSTRAP} resamples, stratified by seed)")
    calibration(rows)
    ltt = ltt_resplits(rows, alpha, delta)
    print(f"\nLearn-then-Test (alpha {alpha}, delta {delta}, taus {TAUS}) over {ltt['splits']} calibration/test "
          f"half-splits: test selective error <= alpha in {ltt['held']:.3f} of them (always-defer in "
          f"{ltt['always_defer']:.3f}); mean test coverage where a tau was certified {ltt['coverage']:.3f}")
    rules(rows)
    figures(rows, best["informed"], docs)


def calibration(rows: list[dict]) -> None:
    print("\n| P(error) of | ECE (15 equal-mass bins) | Brier |\n|---|---|---|")
    for name in ("head", "probe"):
        eces, briers = [], []
        for row in rows:
            scores, errors = tensors(row, "all")
            eces.append(expected_calibration_error(scores[name], errors))
            briers.append(brier(scores[name], errors))
        print(f"| {name} | {mean_ci(eces)} | {mean_ci(briers)} |")


def rules(rows: list[dict]) -> None:
    print("\n| rule (greedy, 500 held-out prompts) | return | questions per episode | accuracy |\n|---|---|---|---|")
    for name in rows[0]["rules"]:
        values = {k: [r["rules"][name][k] for r in rows] for k in ("return", "ask_rate", "accuracy")}
        print(f"| {name} | {mean_ci(values['return'])} | {mean_ci(values['ask_rate'])} | "
              f"{mean_ci(values['accuracy'])} |")
    tree = [r["rules"]["tree policy (rule off)"]["return"] for r in rows]
    for family in ("head threshold", "head value rule", "first-token rule"):
        best = [max(v["return"] for k, v in r["rules"].items() if k.startswith(family)) for r in rows]
        print(f"{family}: best operating point's return minus the tree policy's, per seed "
              f"{[round(b - t, 3) for b, t in zip(best, tree)]} (chosen on the test prompts: optimistic)")


def figures(rows: list[dict], rival: str, docs: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(13, 4), dpi=100)
    pooled = {n: torch.cat([tensors(r, "all")[0][n] for r in rows]) for n in ("head", "probe")}
    errors = torch.cat([tensors(r, "all")[1] for r in rows])
    for name, marker in (("head", "o"), ("probe", "s")):
        bins = reliability_bins(pooled[name], errors, 15)
        left.plot([b[0] for b in bins], [b[1] for b in bins], marker=marker, label=name)
    left.plot([0, 1], [0, 1], color="grey", linestyle=":")
    left.set(xlabel="predicted P(error)", ylabel="observed error rate", title="reliability (15 equal-mass bins)")
    left.legend()
    for name in ("head", rival, "probe"):
        scores, wrong = tensors(rows[0], "informed")
        curve = risk_coverage(scores[name], wrong)
        middle.plot(torch.arange(1, len(curve) + 1) / len(curve), curve, label=name)
    middle.set(xlabel="coverage", ylabel="selective error", title=f"informed states, seed {rows[0]['seed']}")
    middle.legend()
    for family, marker in (("head threshold", "o"), ("head value rule", "^"), ("first-token rule", "s")):
        names = [k for k in rows[0]["rules"] if k.startswith(family)]
        asks = [statistics.mean(r["rules"][k]["ask_rate"] for r in rows) for k in names]
        returns = [statistics.mean(r["rules"][k]["return"] for r in rows) for k in names]
        right.plot(asks, returns, marker=marker, linestyle="", label=family)
    for name, marker in (("tree policy (rule off)", "*"), ("oracle", "X")):
        right.plot(statistics.mean(r["rules"][name]["ask_rate"] for r in rows),
                   statistics.mean(r["rules"][name]["return"] for r in rows), marker=marker, markersize=12,
                   linestyle="", label=name)
    right.set(xlabel="questions per episode", ylabel="mean return", title="return against questions (seed mean)")
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(docs / "risk_head.png")
    print(f"\nfigure: {docs / 'risk_head.png'}")
