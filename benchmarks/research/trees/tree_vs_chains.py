"""Tree rollouts against chains on the multi-round games, each normalisation, at an equal budget of policy tokens.

Protocol 3 (issue 49) is protocol 2 (issue 41) with every run read decision by decision (each row holds the run's
greedy actions per information state, its return per cue, and what its training sampled per state with the
advantages it got: decision_tables.py, decision_report.py), one width per round as each game declares its rounds
(nothing stretched), 8 evaluation seeds, and the seeds run seed by seed. Every run is today's, tuning runs included:
a run is deterministic (the same row twice), but protocol 2's rows were made by the code of then, and today's code
gives other figures for the same arguments (the `mean` tree at 1e-3 on the tuning seed: 0.410 then, 0.484 now).
Protocol 2, the same for every variant:

- budget: ``--budget`` policy tokens per run (36,000 on the decision-hard game, about what 10,000 segments cost
  under protocol 1); the last epoch is cut to the prompts the rest pays for (``token_budget.py``), the actual
  count is reported;
- prompt order: seed ``s`` trains with ``--seed_everything s --data.seed s`` and the task's ``train_order_seed s``
  (each seed its own order of the same training prompts);
- held-out prompts share no text with a training prompt on the decision-hard game (``StaleDigitsTask.unshared``)
  and the calculator (distinct operand tuples); on hidden operands a prompt with a hidden operand is named by its
  visible one, so 370 of the 500 held-out texts are a training prompt's (another answer; the pair is held out);
  the validation prompts choose rates, the test prompts are the table's;
- rates: every variant starts on ``GRID_START`` on the tuning seed ``--tune-seed`` (not one of ``--seeds``); the
  rate with the best validation return is chosen (ties: an interior rate, then the smaller); while it sits at an
  edge of the grid the grid grows by a factor 2 on that side, within ``LR_LIMITS`` (``chosen_rate``);
- then every variant at its chosen rate on ``--seeds``, seed by seed, each seed's variants in the order of their
  tuning-seed validation return (a table cut short has the same seeds for every variant; protocol 2 ran each
  variant through all its seeds); with ``--long``, on the decision-hard game,
  the best tree and the best chains (by validation return on the tuning seed) at 3x budget, then ``--long-also``;
- runs go ``--parallel`` at a time with ``--threads`` torch threads each (2 x 1 by default, the same for every
  variant; the setting is recorded in each row);
- rows go to ``--results`` tagged ``protocol: 3`` and the warm start's hash; a run found there is skipped, so the
  command resumes where it stopped. Protocol 2's rows stay in ``tree_vs_chains_v2.jsonl``, protocol 1's in
  ``tree_vs_chains.jsonl``.

    .venv/bin/python benchmarks/research/trees/tree_vs_chains.py --games stale-digits --long   # issue 49's tables, then reports
    .venv/bin/python benchmarks/research/trees/tree_vs_chains.py --report   # the tables and the plot from what is there
    .venv/bin/python benchmarks/research/trees/tree_vs_chains.py --games stale-digits --long --long-also chains-centred --seeds 1 2 3
    .venv/bin/python benchmarks/research/trees/tree_vs_chains.py --variants tree-wide-first tree-wide-questions  # the ablations

Games (``--games``, default all three, in that order): the decision-hard game (stale digits), then the two earlier
ones (hidden operands, calculator) with each variant without a std beside its pair with one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from benchmarks.research.trees.tree_vs_chains_report import report  # noqa: E402
from benchmarks.research.trees.tree_vs_chains_run import PROTOCOL, marker, model_id  # noqa: E402
from benchmarks.result_rows import read_rows  # noqa: E402

GRID_START = (5e-4, 1e-3, 2e-3)
LR_LIMITS = (6.25e-5, 8e-3)
GAME_BUDGET = {"stale-digits": 36000, "hidden-operands": 12000, "calculator": 11000}  # about what 10,000 and
# 4,000 segments cost under protocol 1
SCOPES = {"sd-tree": "tree", "sd-siblings": "siblings", "sd-none": "none"}
VALUES = {"mean": "mean", "os": "optimal_stopping", "split": "optimal_stopping_split"}
TREES = [f"tree-{short}-{scope}" for short in VALUES for scope in SCOPES]
CHAINS = ["chains-grpo", "chains-centred", "chains-ppo"]
GAME_VARIANTS = {
    # protocol 3 (issue 49): the three learning variants of protocol 2, the corrected value (split), flat groups
    # left out of the normaliser, tree credit on a chain's shape, and the 8-wide answers where answers are decided
    # (no `tree-mean-sd-none`: below the root of a [4, 2, 2, 2] tree every sibling group is a pair, where the split
    # value has nothing to split and takes the mean, so `tree-split-sd-none` trains exactly as it, run for run)
    "stale-digits": ["chains-centred", "tree-os-sd-none", "chains-ppo", "tree-split-sd-none", "tree-os-drop-flat",
                     "tree-chains-shape", "tree-wide-answers", "tree-wide-first", "tree-split-wide-first",
                     "chains-centred-passes4"],
    # the earlier games: the variants without a std and their pairs with one (issue 41: did sigma hold
    # the trees back there too? each pair differs in the std alone, under the same protocol)
    "hidden-operands": ["chains-centred", "tree-mean-sd-none", "tree-os-sd-none", "chains-grpo",
                        "tree-mean-sd-tree", "tree-os-sd-tree"],
    "calculator": ["chains-centred", "tree-mean-sd-none", "tree-os-sd-none", "chains-grpo",
                   "tree-mean-sd-tree", "tree-os-sd-tree"]}
LONG_GAMES = ("stale-digits",)  # --long's 3x-budget runs: the decision-hard game's (issue 41's question)
# one width per round, as each game declares its rounds (max_rounds: 4 on stale digits, 3 on the others); nothing
# is stretched. The 4-2-2 trees and the chains of 8, then the shapes that widen or narrow one round of them (run
# with --variants where not in GAME_VARIANTS): the first round 8 wide as a chain group, the question groups 4 wide,
# the answers 8 wide at the last round where an answer can still be wrong (on stale digits round 3: at round 4
# every digit is known and siblings agree, so a width there carries no signal and it is 1), and a chain's shape
# trained with tree credit (round 1's 8 siblings compared, every later segment an only child with advantage 0)
WIDTHS = {
    "tree": {"stale-digits": [4, 2, 2, 2], "hidden-operands": [4, 2, 2], "calculator": [4, 2, 2]},
    "chains": {"stale-digits": [8, 1, 1, 1], "hidden-operands": [8, 1, 1], "calculator": [8, 1, 1]},
    "tree-wide-first": {"stale-digits": [8, 2, 2, 2], "hidden-operands": [8, 2, 2], "calculator": [8, 2, 2]},
    "tree-wide-questions": {"stale-digits": [4, 4, 4, 2], "hidden-operands": [4, 4, 2], "calculator": [4, 4, 2]},
    "tree-wide-answers": {"stale-digits": [2, 2, 8, 1], "hidden-operands": [2, 2, 8], "calculator": [2, 2, 8]},
    "tree-chains-shape": {"stale-digits": [8, 1, 1, 1], "hidden-operands": [8, 1, 1], "calculator": [8, 1, 1]},
}
ABLATIONS = ["tree-wide-first", "tree-wide-questions"]
# issue 49's attempts at the cue (the last three of the decision-hard game's list), each chosen after the per-state
# tables of the variants before them: the
# first decision widened at equal tokens (with today's and with the corrected value), and four passes over each
# epoch's rollouts (more updates from the same tokens: the tables show the right advantages at the first decision
# and a policy that does not come to read the cue)
NO_SIGMA_OS = ["--model.tree.value_mode", "optimal_stopping", "--model.tree.std_scope", "none"]


def branching(shape: str, game: str) -> str:
    """The ``--data.branching`` of ``shape`` on ``game``, one width per round."""
    return json.dumps(WIDTHS[shape][game]).replace(" ", "")


def variant_arguments(variant: str, game: str) -> list[str]:
    """The command-line arguments of ``variant`` on ``game``; a name ending in ``-passes{k}`` is its base variant
    trained ``k`` times over each epoch's rollouts (``data.ppo_epochs``: more updates from the same tokens)."""
    base, _, passes = variant.rpartition("-passes")
    if base and passes.isdigit():
        return [*variant_arguments(base, game), "--data.ppo_epochs", passes]
    if variant.startswith("chains-"):
        mode = {"chains-grpo": ["--model.advantage_mode", "grpo"],
                "chains-centred": ["--model.advantage_mode", "centered"],
                "chains-ppo": ["--model.advantage_mode", "gae", "--model.value.gamma", "1.0", "--model.value.gae_lambda",
                               "0.95"]}
        # chains take their turns from the game (its max_rounds: the length of WIDTHS["chains"][game])
        return ["--data.rollout", "chains", "--data.group_size", "8",
                *mode[variant]]
    if variant in ("tree-wide-first", "tree-wide-questions", "tree-wide-answers"):
        return ["--data.rollout", "tree", "--data.branching", branching(variant, game), *NO_SIGMA_OS]
    if variant == "tree-chains-shape":  # below round 1 every segment is an only child: the value mode changes nothing
        return ["--data.rollout", "tree", "--data.branching", branching(variant, game), "--model.tree.value_mode",
                "mean", "--model.tree.std_scope", "none"]
    if variant == "tree-split-wide-first":  # the corrected value with the wider first decision
        return ["--data.rollout", "tree", "--data.branching", branching("tree-wide-first", game),
                "--model.tree.value_mode", "optimal_stopping_split", "--model.tree.std_scope", "none"]
    if variant == "tree-os-drop-flat":
        return ["--data.rollout", "tree", "--data.branching", branching("tree", game), *NO_SIGMA_OS,
                "--model.tree.flat_groups", "drop"]
    _, short, scope = variant.split("-", 2)
    return ["--data.rollout", "tree", "--data.branching", branching("tree", game), "--model.tree.value_mode",
            VALUES[short], "--model.tree.std_scope", SCOPES[scope]]


def chosen_rate(returns: dict[float, float]) -> tuple[float | None, float | None]:
    """``(chosen rate, None)`` once the best validation return sits at an interior rate of the grid (or at a limit
    of ``LR_LIMITS``), else ``(None, the next rate to run)``. ``returns``: rate -> validation return.

    Ties: an interior rate before an edge one, then the smaller. Example: {5e-4: 0.1, 1e-3: 0.3, 2e-3: 0.2}
    chooses 1e-3; {5e-4: 0.1, 1e-3: 0.2, 2e-3: 0.3} asks for 4e-3."""
    rates = sorted(returns)
    best = max(returns.values())
    tied = [r for r in rates if returns[r] == best]
    interior = [r for r in tied if rates[0] < r < rates[-1]]
    if interior:
        return interior[0], None
    edge = tied[0]
    beyond = edge * 2 if edge == rates[-1] and len(rates) > 1 else edge / 2
    if not LR_LIMITS[0] <= beyond <= LR_LIMITS[1]:
        return edge, None
    return None, beyond


def load_rows(path: Path, game: str) -> list[dict]:
    """This protocol's rows of ``game`` on today's warm start, one per run (the first written)."""
    model = model_id(game)
    kept: dict[tuple, dict] = {}  # the first row of each run: two schedulers can race to one (same seeds, same row)
    for r in read_rows(path):
        if r.get("protocol") == PROTOCOL and r["game"] == game and r["model"] == model:
            kept.setdefault((r["variant"], r["seed"], r["lr"], r["budget"]), r)
    return list(kept.values())


def tuning(rows: list[dict], variant: str, seed: int, budget: int) -> dict[float, float]:
    return {r["lr"]: r["val_return"] for r in rows if r["variant"] == variant and r["seed"] == seed
            and r["budget"] == budget}


def plan(rows: list[dict], game: str, args: argparse.Namespace) -> tuple[list[dict], dict[str, float]]:
    """The runs still wanted, in priority order, and the rates chosen so far (variant -> rate)."""
    budget = args.budget or GAME_BUDGET.get(game, 14000)
    wanted: list[dict] = [{"variant": "warm-start", "seed": 0, "lr": 0.0, "budget": 0, "arguments": []}]
    chosen: dict[str, float] = {}
    if args.single:  # an ablation outside the grids: each variant at one rate on the tuning seed
        for variant, lr in (item.split("@") for item in args.single):
            wanted.append({"variant": variant, "seed": args.tune_seed, "lr": float(lr), "budget": budget,
                           "arguments": variant_arguments(variant, game)})
        done = {(r["variant"], r["seed"], r["lr"], r["budget"]) for r in rows}
        return [w for w in wanted if (w["variant"], w["seed"], w["lr"], w["budget"]) not in done], chosen
    variants = args.variants or GAME_VARIANTS[game]
    arguments_of: dict[str, list[str]] = {}
    for variant in variants:
        arguments = arguments_of[variant] = variant_arguments(variant, game)
        grid = tuning(rows, variant, args.tune_seed, budget)
        missing = [lr for lr in GRID_START if lr not in grid]
        if not missing:
            rate, further = chosen_rate(grid)
            missing = [further] if further else []
            if rate is not None:
                chosen[variant] = rate
        wanted += [{"variant": variant, "seed": args.tune_seed, "lr": lr, "budget": budget, "arguments": arguments}
                   for lr in missing]
    # seed by seed, each seed's variants by validation return on the tuning seed, best first: a table cut short
    # has the same seeds for every variant (protocol 3; protocol 2 ran each variant through all its seeds)
    pairs = sorted(((v, seed) for v in chosen for seed in args.seeds),
                   key=lambda p: (args.seeds.index(p[1]), -tuning(rows, p[0], args.tune_seed, budget)[chosen[p[0]]]))
    for variant, seed in pairs:
        wanted.append({"variant": variant, "seed": seed, "lr": chosen[variant], "budget": budget,
                       "arguments": arguments_of[variant]})
    if args.long and game in LONG_GAMES and all(v in chosen for v in variants):
        longer = [best_of([v for v in variants if v.startswith("tree")], rows, args.tune_seed, budget),
                  best_of([v for v in variants if v.startswith("chains")], rows, args.tune_seed, budget),
                  *(args.long_also or [])]  # --long-also: named by the user, not by the protocol
        for best in dict.fromkeys(v for v in longer if v in chosen):
            wanted += [{"variant": best, "seed": seed, "lr": chosen[best], "budget": 3 * budget,
                        "arguments": arguments_of[best]} for seed in args.seeds]
    done = {(r["variant"], r["seed"], r["lr"], r["budget"]) for r in rows}
    return [w for w in wanted if (w["variant"], w["seed"], w["lr"], w["budget"]) not in done], chosen


def best_of(variants: list[str], rows: list[dict], seed: int, budget: int) -> str | None:
    """The variant with the best validation return on the tuning seed at its chosen rate (None until every one
    of ``variants`` has chosen; ties: the first listed)."""
    best = {}
    for variant in variants:
        grid = tuning(rows, variant, seed, budget)
        rate = chosen_rate(grid)[0] if set(GRID_START) <= set(grid) else None
        if rate is None:
            return None
        best[variant] = grid[rate]
    return max(best, key=best.get) if best else None


def run_missing(args: argparse.Namespace, game: str) -> None:
    """Keep ``--parallel`` runs going, each the most important one not done nor running, until none is wanted or
    ``--launch-until`` (UTC ``HH:MM``) has passed."""
    running: dict[tuple, subprocess.Popen] = {}
    until = datetime.datetime.combine(datetime.datetime.now(datetime.timezone.utc).date(),
                                      datetime.time.fromisoformat(args.launch_until), datetime.timezone.utc)
    while True:
        for key, process in list(running.items()):
            if process.poll() is not None:
                del running[key]
        wanted, _ = plan(load_rows(args.results, game), game, args)
        wanted = [w for w in wanted if (w["variant"], w["seed"], w["lr"], w["budget"]) not in running
                  and not going_elsewhere({**w, "game": game, "results": str(args.results)})]
        late = datetime.datetime.now(datetime.timezone.utc) >= until
        if (not wanted or late) and not running:
            return
        while wanted and not late and len(running) < args.parallel:
            w = wanted.pop(0)
            run = {**w, "game": game, "results": str(args.results), "threads": args.threads}
            running[(w["variant"], w["seed"], w["lr"], w["budget"])] = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("tree_vs_chains_run.py")), json.dumps(run)], cwd=ROOT)
            if w["variant"] == "warm-start":
                break  # alone: the grid's first rows follow it
        time.sleep(5)


def going_elsewhere(run: dict) -> bool:
    """Whether another scheduler's process is running ``run`` (its marker names a live pid)."""
    going = marker(run)
    try:
        os.kill(int(going.read_text()), 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=list(GAME_VARIANTS), choices=list(GAME_VARIANTS))
    parser.add_argument("--variants", nargs="+", default=None, help="default: the game's (GAME_VARIANTS)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--tune-seed", type=int, default=0, help="the seed of every variant's rate grid")
    parser.add_argument("--budget", type=int, default=None, help="policy tokens per run (default: GAME_BUDGET)")
    parser.add_argument("--long", action="store_true", help="also the best tree and best chains at 3x budget")
    parser.add_argument("--long-also", nargs="+", default=None, metavar="VARIANT",
                        help="with --long: these variants at 3x budget too, after the protocol's two")
    parser.add_argument("--single", nargs="+", default=None, metavar="VARIANT@LR",
                        help="instead of the protocol: each VARIANT at LR on the tuning seed (an ablation)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--launch-until", default="23:59", help="UTC HH:MM after which no run starts")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "tree_vs_chains_v3.jsonl")
    parser.add_argument("--report", action="store_true", help="only print the tables from the results file")
    args = parser.parse_args()
    for game in args.games:
        if not args.report:
            run_missing(args, game)
        rows = load_rows(args.results, game)
        shown = args.variants or [*GAME_VARIANTS[game], *(a for a in ABLATIONS if any(r["variant"] == a
                                                                                          for r in rows))]
        report(rows, game, args, plan(rows, game, argparse.Namespace(**{**vars(args), "variants": shown}))[1])


if __name__ == "__main__":
    main()
