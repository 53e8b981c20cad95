"""The decision-by-decision tables of benchmarks/research/trees/tree_vs_chains.py (issue 49), from the rows' decisions
(``decision_tables.py``): each variant's return per cue beside the policies that ignore the cue, its greedy actions
per information state, what its training rollouts sampled at the first decision and with what advantage, its rows
with advantage exactly 0 per round, and which policy each run equals."""

from __future__ import annotations

import statistics

CUE_FREE = ("answer at once", "ask until none", "stop when known", "oracle")
STATES = ("start", "a", "b", "c", "none")


def collapsed(row: dict) -> bool:
    """A run below answering at once on the test prompts (it lost what the warm start's never-asking floor gives)."""
    return row["test_return"] < row["test_answer_at_once"]


def equals(row: dict, cue_free: dict) -> str:
    """Which policy a run's greedy play equals, cue by cue: the cue-free policy (or the oracle) whose per-cue return
    is within 0.02 of the run's at every cue, else the cue-free policy nearest in mean absolute difference, marked
    ``~``. Reads only the test prompts."""
    cues = row["test_decisions"]["cues"]
    distance = {name: [abs(cues[c]["return"] - cue_free[name][c]["return"]) for c in cues] for name in CUE_FREE}
    exact = [name for name, gaps in distance.items() if max(gaps) <= 0.02]
    if exact:
        return exact[0]
    return "~" + min(distance, key=lambda name: statistics.fmean(distance[name]))


def answer_share(row: dict, key: str) -> float | None:
    """The share of a greedy run's visits of ``cue|state`` that answered (None: never visited)."""
    counts = row["test_decisions"]["actions"].get(key)
    if not counts or not sum(counts.values()):
        return None
    return counts["answer"] / sum(counts.values())


def mean_of(values: list[float | None]) -> str:
    kept = [v for v in values if v is not None]
    return f"{statistics.fmean(kept):.2f}" if kept else "-"


def cue_table(variants: dict[str, list[dict]], cue_free: dict) -> None:
    """Test return (questions) per cue: each variant's mean over its seeds, then the cue-free policies exactly."""
    cues = sorted(cue_free["oracle"])
    cues = [c for c in cues if c != "all"]
    print("\nper cue, test prompts: return (questions / episode); variants: mean over seeds")
    print("| policy | seeds | " + " | ".join(f"cue {c}" for c in cues) + " | all |")
    print("|---|---|" + "---|" * (len(cues) + 1))
    for name in CUE_FREE:
        cells = [f"{cue_free[name][c]['return']:.3f} ({cue_free[name][c]['questions']:.2f})" for c in [*cues, "all"]]
        print(f"| {name} (exact) | - | " + " | ".join(cells) + " |")
    for variant, runs in variants.items():
        cells = []
        for cue in cues:
            ret = statistics.fmean(r["test_decisions"]["cues"][cue]["return"] for r in runs)
            questions = statistics.fmean(r["test_decisions"]["cues"][cue]["questions"] for r in runs)
            cells.append(f"{ret:.3f} ({questions:.2f})")
        cells.append(f"{statistics.fmean(r['test_return'] for r in runs):.3f} "
                     f"({statistics.fmean(r['test_questions'] for r in runs):.2f})")
        print(f"| {variant} | {len(runs)} | " + " | ".join(cells) + " |")


def state_table(variants: dict[str, list[dict]]) -> None:
    """Share of greedy visits that answered, per cue and state (mean over the seeds that visited it)."""
    cues = ("A", "B", "C", "D")
    print("\ngreedy answer share per information state (test prompts; mean over seeds that reached it; the oracle "
          "answers at A start, at B after any reply, at C and D once every digit is known)")
    print("| variant | " + " | ".join(f"{c} {s}" for c in cues for s in STATES) + " |")
    print("|---|" + "---|" * (len(cues) * len(STATES)))
    for variant, runs in variants.items():
        cells = [mean_of([answer_share(r, f"{c}|{s}") for r in runs]) for c in cues for s in STATES]
        print(f"| {variant} | " + " | ".join(cells) + " |")


def sampled_table(variants: dict[str, list[dict]]) -> None:
    """At the first decision under each cue, what training sampled: the share that answered at once and the mean
    advantage of answering and of asking there, over the first 10 epochs and over the whole run."""
    print("\ntraining rollouts at the first decision (cue|start): answer share / mean advantage of answering / of "
          "asking; first 10 epochs, then the whole run (mean over seeds)")
    cues = ("A", "B", "C", "D")
    print("| variant | window | " + " | ".join(f"cue {c}" for c in cues) + " |")
    print("|---|---|" + "---|" * len(cues))
    for variant, runs in variants.items():
        for window in ("sampled_first10", "sampled"):
            cells = []
            for cue in cues:
                share = [r[window].get(f"{cue}|start|answer", {}).get("share", 0.0) for r in runs if r.get(window)]
                good = [r[window][f"{cue}|start|answer"]["mean_advantage"] for r in runs
                        if r.get(window) and f"{cue}|start|answer" in r[window]]
                bad = [r[window][f"{cue}|start|ask"]["mean_advantage"] for r in runs
                       if r.get(window) and f"{cue}|start|ask" in r[window]]
                cells.append(f"{mean_of(share)} / {mean_of(good)} / {mean_of(bad)}")
            label = "epochs 1-10" if window == "sampled_first10" else "all"
            print(f"| {variant} | {label} | " + " | ".join(cells) + " |")


def credit_table(variants: dict[str, list[dict]]) -> None:
    """Per round: the share of a run's rows there, and the share of them with advantage exactly 0."""
    print("\nrows per round (share of all rows) and, of them, the share with advantage exactly 0 (mean over seeds "
          "and epochs)")
    print("| variant | round 1 | round 2 | round 3 | round 4 |")
    print("|---|---|---|---|---|")
    for variant, runs in variants.items():
        cells = []
        for d in range(1, 5):
            rows = [r["round_credit"].get(f"rows_round{d}") for r in runs if r.get("round_credit")]
            zero = [r["round_credit"].get(f"zero_advantage_round{d}") for r in runs if r.get("round_credit")]
            cells.append(f"{mean_of(rows)} / {mean_of(zero)}")
        print(f"| {variant} | " + " | ".join(cells) + " |")


def cue_use(row: dict) -> float | None:
    """How much a run's first decision reads the cue: its greedy share of answering at once at cue ``A`` less the
    share at cue ``D`` (the oracle: 1 - 0 = 1; a policy blind to the cue: 0)."""
    at_a, at_d = answer_share(row, "A|start"), answer_share(row, "D|start")
    return None if at_a is None or at_d is None else at_a - at_d


def run_table(variants: dict[str, list[dict]], cue_free: dict) -> None:
    """Each run: its test return, questions, the policy it equals, and how much its first decision reads the cue."""
    print("\neach run (test prompts): return / questions per episode / the policy it equals (~: nearest) / cue use "
          "(answering at once at A less at D: the oracle 1, a cue-blind policy 0); COLLAPSED: below answering at once")
    for variant, runs in variants.items():
        cells = [f"s{r['seed']} {r['test_return']:.3f}/{r['test_questions']:.2f}/{equals(r, cue_free)}/"
                 f"{mean_of([cue_use(r)])}{' COLLAPSED' if collapsed(r) else ''}" for r in runs]
        uses = [u for u in map(cue_use, runs) if u is not None]
        print(f"- {variant} (cue use {min(uses):+.2f} to {max(uses):+.2f}): " + "; ".join(cells))


def decision_report(rows: list[dict], variants: list[str], chosen: dict[str, float], seeds: list[int],
                    budget: int) -> None:
    """Every table above for the runs of ``variants`` at their chosen rates on ``seeds`` at ``budget`` that carry
    decisions (protocol 3's rows)."""
    runs = {v: sorted((r for r in rows if r["variant"] == v and r["seed"] in seeds and r["budget"] == budget
                       and r["lr"] == chosen.get(v) and "test_decisions" in r), key=lambda r: r["seed"])
            for v in variants}
    runs = {v: rs for v, rs in runs.items() if rs}
    warm = next((r for r in rows if r["variant"] == "warm-start" and "test_cue_free" in r), None)
    if not runs or warm is None:
        return
    cue_free = warm["test_cue_free"]
    print(f"\n## decisions at {budget} policy tokens")
    cue_table(runs, cue_free)
    state_table(runs)
    sampled_table(runs)
    credit_table(runs)
    run_table(runs, cue_free)
