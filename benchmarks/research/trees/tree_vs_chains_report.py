"""The tables and the plot of benchmarks/research/trees/tree_vs_chains.py (protocols 2 and 3) from its results rows; the
tables read decision by decision are decision_report.py's."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.research.trees.decision_report import decision_report

ROOT = Path(__file__).resolve().parents[3]
# Student's t 0.975 quantiles by degrees of freedom (no SciPy dependency for ten numbers)
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / len(values) ** 0.5


def cue_free(game: str) -> dict:
    """The policies that read no cue, exactly, on the stale-digits test prompts ({} for the other games)."""
    if game != "stale-digits":
        return {}
    from benchmarks.research.trees.decision_tables import cue_free_policies  # noqa: PLC0415
    from lit_grpo.tasks.games.stale_digits import StaleDigitsTask  # noqa: PLC0415

    task = StaleDigitsTask()
    return cue_free_policies(task, list(task.test_records()))


def gap_closed(value: float, start: float, oracle: float) -> float:
    """The share of the gap from ``start`` to ``oracle`` that ``value`` closes (1: the oracle's return)."""
    return (value - start) / (oracle - start)


def grid_table(rows: list[dict], variants: list[str], args: argparse.Namespace, budget: int,
               chosen: dict[str, float]) -> None:
    rates = sorted({r["lr"] for r in rows if r["seed"] == args.tune_seed and r["budget"] == budget and r["lr"]})
    print(f"\nrate grids, tuning seed {args.tune_seed}, validation return (questions / episode):")
    print("| variant | " + " | ".join(f"lr {lr:g}" for lr in rates) + " | chosen |")
    print("|---|" + "---|" * (len(rates) + 1))
    for variant in variants:
        cells = [next((f"{r['val_return']:.3f} ({r['val_questions']:.2f})" for r in rows if r["variant"] == variant
                       and r["lr"] == lr and r["seed"] == args.tune_seed and r["budget"] == budget), "") for lr in rates]
        print(f"| {variant} | " + " | ".join(cells) + f" | {chosen.get(variant, 'grid not done')} |")


def seed_table(rows: list[dict], variants: list[str], args: argparse.Namespace, budget: int,
               chosen: dict[str, float], warm: dict) -> dict[str, list[float]]:
    """Print the table at ``budget``; returns variant -> the test return of each seed."""
    print(f"\nseeds {' '.join(map(str, args.seeds))} at the chosen rates, {budget} policy tokens a run, test prompts "
          "(mean ± 95% t-interval over seeds):")
    print("| variant | lr | seeds | test return | accuracy | questions / episode | gap closed from answering at once "
          "| gap closed from the warm start | collapsed (below answering at once) | policy tokens (min-max) | epochs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    finals = {}
    for variant in variants:
        runs = sorted((r for r in rows if r["variant"] == variant and r["seed"] in args.seeds
                       and r["budget"] == budget and r["lr"] == chosen.get(variant)), key=lambda r: r["seed"])
        if not runs:
            continue
        ret, acc, questions = (interval([r[f"test_{k}"] for r in runs]) for k in ("return", "accuracy", "questions"))
        at_once = interval([gap_closed(r["test_return"], r["test_answer_at_once"], r["test_oracle"]) for r in runs])
        from_warm = interval([gap_closed(r["test_return"], warm["test_return"], r["test_oracle"]) for r in runs])
        tokens = [r["policy_tokens"] for r in runs]
        print(f"| {variant} | {chosen[variant]:g} | {','.join(str(r['seed']) for r in runs)} | "
              + " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in (ret, acc, questions))
              + f" | {at_once[0]:.0%} ± {at_once[1]:.0%} | {from_warm[0]:.0%} ± {from_warm[1]:.0%} | "
              f"{sum(r['test_return'] < r['test_answer_at_once'] for r in runs)} of {len(runs)} | "
              f"{statistics.fmean(tokens):.0f} ({min(tokens):.0f}-{max(tokens):.0f}) | "
              f"{statistics.fmean(r['epochs'] for r in runs):.0f} |")
        finals[variant] = [r["test_return"] for r in runs]
    return finals


def report(rows: list[dict], game: str, args: argparse.Namespace, chosen: dict[str, float]) -> None:
    # the scheduler imports this module
    from benchmarks.research.trees.tree_vs_chains import GAME_BUDGET, GAME_VARIANTS  # noqa: PLC0415

    warm = next((r for r in rows if r["variant"] == "warm-start"), None)
    if warm is None:
        print(f"{game}: no rows of this protocol yet")
        return
    budget = args.budget or GAME_BUDGET.get(game, 14000)
    print(f"\n{game} (warm start {warm['model']}, protocol {warm['protocol']}): test prompts {warm['test_prompts']}: "
          f"warm start "
          f"{warm['test_return']:.3f} (questions {warm['test_questions']:.2f}), answering at once "
          f"{warm['test_answer_at_once']:.3f}, oracle {warm['test_oracle']:.3f}; validation prompts "
          f"{warm['val_prompts']}: warm start {warm['val_return']:.3f}, answering at once "
          f"{warm['val_answer_at_once']:.3f}, oracle {warm['val_oracle']:.3f}")
    goal = warm["test_answer_at_once"] + 0.75 * (warm["test_oracle"] - warm["test_answer_at_once"])
    print(f"75% of the answer-at-once-to-oracle gap on the test prompts: {goal:.3f}")
    blind = cue_free(game)
    for name in ("ask until none", "stop when known"):
        if blind:
            print(f"the cue-free policy '{name}': {blind[name]['all']['return']:.4f} "
                  f"({blind[name]['all']['questions']:.2f} questions)")
    variants = args.variants or GAME_VARIANTS[game]
    variants = [*variants, *sorted({r["variant"] for r in rows} - set(variants) - {"warm-start"})]
    if blind:
        best = max(v["all"]["return"] for k, v in blind.items() if k != "oracle")
        print(f"the best policy that reads no cue returns {best:.4f}; learning the cue: the lower end of a 95% "
              f"interval at or above {best + 0.05:.4f}")
    grid_table(rows, variants, args, budget, chosen)
    finals = seed_table(rows, variants, args, budget, chosen, warm)
    decision_report(rows, variants, chosen, args.seeds, budget)
    if any(r["budget"] == 3 * budget for r in rows):
        seed_table(rows, variants, args, 3 * budget, chosen, warm)
        decision_report(rows, variants, chosen, args.seeds, 3 * budget)
    if finals:
        plot(game, finals, warm, goal, budget, blind)


def plot(game: str, finals: dict[str, list[float]], warm: dict, goal: float, budget: int,
         blind: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    names = sorted(finals, key=lambda n: -statistics.fmean(finals[n]))
    intervals = [interval(finals[n]) for n in names]
    axes.errorbar(range(len(names)), [m for m, _ in intervals], yerr=[h for _, h in intervals], fmt="o", capsize=4,
                  color="black", label="mean ± 95% t-interval")
    for i, name in enumerate(names):  # each seed's run
        axes.scatter([i + 0.12] * len(finals[name]), finals[name], s=9, color="tab:blue", zorder=3,
                     label="one seed" if i == 0 else None)
    for y, label, style in ((warm["test_oracle"], "oracle", "-"), (goal, "75% of the gap to the oracle", "--"),
                            (warm["test_answer_at_once"], "answering at once", ":"),
                            (warm["test_return"], "warm start", "-."),
                            *([(blind["ask until none"]["all"]["return"], "ask until 'none;' (no cue)", (0, (1, 4))),
                               (blind["stop when known"]["all"]["return"], "ask until every digit is known (no cue)",
                                (0, (5, 2)))] if blind else [])):
        axes.axhline(y, linestyle=style, color="grey", linewidth=1, label=label)
    axes.legend(fontsize=7, loc="lower left")
    axes.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    axes.set_ylabel("held-out (test) return, mean ± 95% t-interval")
    axes.set_title(f"{game}: {budget} policy tokens a run, each variant at its chosen rate")
    out = ROOT / "docs" / f"tree_vs_chains_{game}_heldout_protocol{warm['protocol']}.png"
    figure.savefig(out, dpi=100, bbox_inches="tight")
    print(f"\nplot: {out.relative_to(ROOT)}")
