"""Does a risk head that reads the policy's own draft know when the answer is wrong? (issue 35, item 3)

The game (``--game``): the calculator (``CalculatorTask``: sums of 2 to 4 operands, a question reduces two of them)
played by its warm start ``data/tiny-llama-calculator``, whose informed answers fail often enough to rank (~12% of
the drafts wrong once the oracle's calls are made, measured: the report's first line), 3 rounds; ``stale-digits``
(``StaleDigitsTask``, the decision-hard game, warm start ``data/tiny-llama-stale``), 4 rounds, where a question whose
reply is ``none;`` costs ``idle_ask_cost`` instead of ``ask_cost``; ``hidden-operands`` is there too, but with the
first token forced to a digit its informed drafts are ~97% right, too few errors to rank. The decision states are
every held-out prompt (``heldout_records``: validation, then test) after 0 .. rounds - 1 questions (the replies the
game gives); at each the policy drafts its greedy answer (first token forced to a digit) and the draft is right or
wrong. Each state's row keeps the reward of answering there and the reward of the question asked from there (what
``task.step`` gives), so risk_curves.py replays every game's episodes exactly with no constant of its own.

Per seed: the draft-reading head (``lit_grpo.risk.draft.LogisticHead`` on ``draft_features``: the hidden state at
the draft's last token and its token log-probs) and the pre-answer probe (the same regression on the state before
the answer, ``context_features``: hidden state, top log-prob, entropy — what the risk head of ``risk/head.py`` reads)
are fitted on the states of ``--train-prompts`` training prompts drawn with the seed; the held-out states (every
held-out prompt, or the first ``--heldout``; the same for every seed) are scored by them and by the baselines of
benchmarks/research/risk/risk.py: 1 - the draft's
first-token probability, the entropy before it, minus its log-prob, 1 - its smallest token probability,
disagreement of 8 answers sampled at temperature 1 (seeded), and the "information still hidden" flag.

Rules: a draft rule commits the draft where the score is at most a threshold and asks elsewhere (the last round
always answers). Its episodes follow from the state table (each state's draft and reply are fixed), so every
threshold's return and questions per episode are exact; each score's return is read at matched ask rates (the
policy's own rate and the oracle's) by interpolating between its neighbouring operating points. One threshold of
the head is also played through ``DraftRule`` in ``greedy_trees`` as a check that the table is what the rule does.

    .venv/bin/python benchmarks/research/risk/risk_draft.py [--seeds 0 1 2] [--train-prompts 600] [--game calculator]

Rows go to the game's file (``risk_episodes.results_path``: the calculator's ``benchmarks/results/risk_draft.jsonl``,
stale-digits' ``risk_draft_stale_digits.jsonl``; a seed already there is skipped); the report reuses risk_report.py's
AUROC / E-AURC / ECE / Learn-then-Test code. Run it alone: it takes the 2 cores.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the checkout, for benchmarks.*

from lit_grpo.engines import HFEngine, SamplingSpec  # noqa: E402
from lit_grpo.policy.model_loading import load_policy  # noqa: E402
from lit_grpo.policy.risk_features import context_features, draft_features  # noqa: E402
from lit_grpo.risk.draft import DraftRule, LogisticHead  # noqa: E402
from lit_grpo.run.model_files import load_tokenizer  # noqa: E402
from lit_grpo.tasks.games import CalculatorTask, HiddenOperandsTask  # noqa: E402
from lit_grpo.tasks.games.stale_digits import StaleDigitsTask  # noqa: E402
from benchmarks.research.risk.risk_episodes import StateTable, at, curve, results_path, upper  # noqa: E402
from benchmarks.research.risk.risk_report import (  # noqa: E402
    SIGNALS,
    calibration,
    ltt_resplits,
    mean_ci,
    paired_auroc_gap,
    print_signal_table,
)
from benchmarks.research.risk.risk_signals import agreement, play  # noqa: E402
from benchmarks.result_rows import append_row, read_rows  # noqa: E402

GAMES = {"hidden-operands": (ROOT / "data" / "tiny-llama-hidden", HiddenOperandsTask, 3),
         "calculator": (ROOT / "data" / "tiny-llama-calculator", CalculatorTask, 3),
         "stale-digits": (ROOT / "data" / "tiny-llama-stale", StaleDigitsTask, 4)}  # warm start, task, decision rounds


class Drafting:
    """The policy's greedy drafts (first token forced to an answer) and their features, on one engine."""

    def __init__(self, game: str) -> None:
        model, task_class, self.rounds = GAMES[game]
        self.task, self.game = task_class(), game
        self.tokenizer = load_tokenizer(str(model))
        self.policy = load_policy(str(model), 16, 32, 0.0, "all-linear", dtype="float32")
        self.policy.eval()
        self.engine = HFEngine()
        self.engine.push_policy(self.policy)
        self.pad = self.tokenizer.pad_token_id
        self.answer_ids = tuple(self.task.answer_token_ids(self.tokenizer))
        self.spec = SamplingSpec(max_new_tokens=5, greedy=True, stop_token_ids=(self.tokenizer.eos_token_id,))

    def drafts(self, contexts: list[list[int]]) -> list[list[int]]:
        """Each context's greedy answer, its tokens without the stop token (never empty: the first is a digit)."""
        spec = replace(self.spec, allowed_token_ids=(self.answer_ids,) * len(contexts))
        stop = set(self.spec.stop_token_ids)
        return [[t for t in group[0].token_ids if t not in stop] for group in self.engine.generate(contexts, 1, spec)]

    def features(self, contexts: list[list[int]]) -> torch.Tensor:
        """The draft head's input at each context ``[B, H + 3]`` (what ``DraftRule`` asks its drafter for)."""
        return draft_features(self.policy, contexts, self.drafts(contexts), self.pad)

    def context(self, record: dict, questions: int) -> list[int]:
        ids = self.task.prompt_ids(record, self.tokenizer)
        for question in range(1, questions + 1):
            ids += self.tokenizer("?", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            ids += self.tokenizer(self.task.reply(record, question), add_special_tokens=False)["input_ids"]
        return ids


def states(drafting: Drafting, records: list[dict]) -> dict:
    """Every record after 0 .. rounds - 1 questions: context, draft, error, informed, reward of answering, reward of
    the question asked from there (``task.step``: on stale-digits an idle question costs more), and the features of
    the draft head and of the pre-answer probe (rows ordered record-major)."""
    table = {key: [] for key in ("record", "questions", "context", "draft", "error", "informed", "answer_reward",
                                 "ask_reward")}
    for index, record in enumerate(records):
        for questions in range(drafting.rounds):
            table["record"].append(index)
            table["questions"].append(questions)
            table["context"].append(drafting.context(record, questions))
    table["draft"] = drafting.drafts(table["context"])
    for index, questions, draft in zip(table["record"], table["questions"], table["draft"]):
        record = records[index]
        step = drafting.task.step(record, questions + 1, drafting.tokenizer.decode(draft, skip_special_tokens=True))
        table["error"].append(not step.correct)
        table["answer_reward"].append(step.reward)
        table["ask_reward"].append(drafting.task.step(record, questions + 1, "?").reward)
        table["informed"].append(questions >= drafting.task.informed_questions(record))
    table["draft_features"] = draft_features(drafting.policy, table["context"], table["draft"], drafting.pad)
    table["context_features"] = context_features(drafting.policy, table["context"], drafting.pad)
    return table


def scores(drafting: Drafting, train: dict, test: dict, seed: int) -> tuple[dict[str, torch.Tensor], LogisticHead]:
    """Every signal at every held-out state (higher = an error is likelier) ``[M]`` each, and the fitted head."""
    errors = torch.tensor(train["error"])
    head = LogisticHead().fit(train["draft_features"], errors)
    probe = LogisticHead().fit(train["context_features"], errors)
    confidences = test["draft_features"][:, -3:]  # [M, 3]: sum, smallest, first token log-prob
    decisions = [{"context": c, "segment": d} for c, d in zip(test["context"], test["draft"])]
    sampled = SamplingSpec(max_new_tokens=5, temperature=1.0, seed=seed, stop_token_ids=drafting.spec.stop_token_ids,
                           allowed_token_ids=(drafting.answer_ids,) * len(decisions))
    return {"head": head.p_error(test["draft_features"]), "probe": probe.p_error(test["context_features"]),
            "first_token_prob": 1 - confidences[:, 2].exp(), "first_token_entropy": test["context_features"][:, -1],
            "seq_logprob": -confidences[:, 0], "min_token_prob": 1 - confidences[:, 1].exp(),
            "agreement_8": agreement(drafting.engine, drafting.tokenizer, decisions, sampled),
            "info_hidden": torch.tensor([float(not i) for i in test["informed"]])}, head


def state_rewards(test: dict, rounds: int) -> StateTable:
    """The held-out table's rewards as ``risk_episodes`` replays them."""
    return StateTable(rounds, np.array(test["answer_reward"], dtype=float).reshape(-1, rounds),
                      np.array(test["ask_reward"], dtype=float).reshape(-1, rounds))


def rule_curve(test: dict, score: torch.Tensor, rounds: int) -> list[tuple[float, float, float]]:
    """``(threshold, questions per episode, mean return)`` of the draft rule at every distinct threshold (and
    always asking, never asking): at each state ask while the score is above the threshold (the last round
    answers), else commit the draft; each question costs what the table says it cost there."""
    table = state_rewards(test, rounds)
    thresholds = [-float("inf"), *sorted({float(s) for s in score}), float("inf")]
    return curve(table, score.tolist(), list(range(table.records)), thresholds)


def midway_threshold(score: torch.Tensor) -> float:
    """Halfway between the median-low score and the next larger one: no state sits at the threshold, where the
    score recomputed in another batch (a last-bit difference) could flip the played rule's decision (seen: a state
    at exactly the median asked once more when played than in the table)."""
    values = sorted({float(s) for s in score})
    low = statistics.median_low(float(s) for s in score)
    above = [v for v in values if v > low]
    return (low + above[0]) / 2 if above else low


def return_at(curve: list[tuple[float, float, float]], ask_rate: float) -> float:
    """The curve's return at ``ask_rate``: linear between the operating points on either side (the best return
    among points at the same rate)."""
    return at(upper([(asks, ret) for _, asks, ret in curve]), ask_rate)


def one_seed(drafting: Drafting, seed: int, train_prompts: int, test: dict, heldout: list[dict]) -> dict:
    pool = list(drafting.task.train_records())
    train_records = random.Random(seed).sample(pool, train_prompts)
    started = time.time()
    train = states(drafting, train_records)
    signal, head = scores(drafting, train, test, seed)
    rounds = drafting.rounds
    policy_alone = play(drafting.task, drafting.engine, drafting.tokenizer, heldout, rounds, drafting.spec)
    oracle_rate = statistics.fmean(drafting.task.oracle_questions(r) for r in heldout)
    targets = {"policy": policy_alone["ask_rate"], "oracle": oracle_rate}
    rules = {"policy alone": policy_alone}
    for name, score in signal.items():
        points = rule_curve(test, score, rounds)
        rules[name] = {f"return@{k}": return_at(points, rate) for k, rate in targets.items()}
        rules[name]["best"] = max(c[2] for c in points)
    tau = midway_threshold(signal["head"])  # one operating point, played for real
    rule = DraftRule(drafting.features, head, tau, drafting.task.defer_token_ids(drafting.tokenizer),
                     drafting.answer_ids, last_round=rounds)
    played = play(drafting.task, drafting.engine, drafting.tokenizer, heldout, rounds, drafting.spec, rule)
    table = curve(state_rewards(test, rounds), signal["head"].tolist(), list(range(len(heldout))), [tau])[0]
    return {"seed": seed, "game": drafting.game, "rounds": rounds, "train_prompts": train_prompts,
            "errors": test["error"], "informed": test["informed"], "answer_rewards": test["answer_reward"],
            "ask_rewards": test["ask_reward"],
            "oracle": {"ask_rate": oracle_rate, "return": drafting.task.oracle_return(heldout)},
            "train_errors": sum(train["error"]), "train_states": len(train["error"]),
            "scores": {k: v.tolist() for k, v in signal.items()}, "rules": rules, "targets": targets,
            "played_check": {"tau": tau, "played": played, "table": {"ask_rate": table[1], "return": table[2]}},
            "seconds": time.time() - started}


def report(rows: list[dict], alpha: float, delta: float) -> None:
    errors_informed = [sum(e and i for e, i in zip(r["errors"], r["informed"])) for r in rows]
    print(f"\n{len(rows)} seeds; held-out states {len(rows[0]['errors'])}, errors {sum(rows[0]['errors'])}, informed "
          f"{sum(rows[0]['informed'])}, errors among informed {errors_informed[0]} "
          f"({errors_informed[0] / max(sum(rows[0]['informed']), 1):.1%}); training states per seed "
          f"{[r['train_states'] for r in rows]} with errors {[r['train_errors'] for r in rows]}")
    for subset in ("all", "informed"):
        table = print_signal_table(rows, subset, "states")
        rivals = [n for n in SIGNALS if n != "head"]
        best = max(rivals, key=lambda n: statistics.mean(table[n]["AUROC"]))
        gap = statistics.mean(table["head"]["AUROC"]) - statistics.mean(table[best]["AUROC"])
        print(f"\nbest baseline by AUROC: {best}; AUROC(head) - AUROC({best}) = {gap:+.3f}")
        if subset == "informed":
            point, low, high = paired_auroc_gap(rows, best)
            print(f"paired bootstrap (informed): {point:+.3f} [{low:+.3f}, {high:+.3f}]")
    calibration(rows)
    ltt = ltt_resplits(rows, alpha, delta)
    print(f"\nLearn-then-Test (alpha {alpha}, delta {delta}) over {ltt['splits']} half-splits: test selective error "
          f"<= alpha in {ltt['held']:.3f} (always-defer {ltt['always_defer']:.3f}); mean coverage {ltt['coverage']:.3f}")
    targets = {k: statistics.fmean(r["targets"][k] for r in rows) for k in ("policy", "oracle")}
    print(f"\n| rule (held-out, greedy) | return at the policy's ask rate ({targets['policy']:.2f}) | return at the "
          f"oracle's ({targets['oracle']:.2f}) | best operating point (optimistic) |\n|---|---|---|---|")
    alone = [r["rules"]["policy alone"]["return"] for r in rows]
    print(f"| policy alone | {mean_ci(alone)} | — | — |")
    for name in SIGNALS:
        cells = [mean_ci([r["rules"][name][key] for r in rows]) for key in ("return@policy", "return@oracle", "best")]
        print(f"| draft rule on {name} | " + " | ".join(cells) + " |")
    for r in rows:
        check = r["played_check"]
        print(f"seed {r['seed']}: DraftRule played at tau {check['tau']:.3f}: return {check['played']['return']:.3f}, "
              f"questions {check['played']['ask_rate']:.3f}; the table's {check['table']['return']:.3f}, "
              f"{check['table']['ask_rate']:.3f}")


def stored(results: Path, game: str, train_prompts: int) -> list[dict]:
    """The rows of ``game`` in ``results`` (rows without a game are the calculator's first ones); refused when a row
    of that game was drawn from another number of training prompts (rows of two setups never mix)."""
    rows = [r for r in read_rows(results) if r.get("game", "calculator") == game]
    other = sorted({r["train_prompts"] for r in rows} - {train_prompts})
    if other:
        raise SystemExit(f"{results} holds {game} rows of {other} training prompts, not {train_prompts}: another file")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train-prompts", type=int, default=600, help="training prompts drawn per seed")
    parser.add_argument("--alpha", type=float, default=0.05, help="target selective error of Learn-then-Test")
    parser.add_argument("--delta", type=float, default=0.1, help="Learn-then-Test's level")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--heldout", type=int, default=None,
                        help="the first N held-out prompts (default: all of them, validation then test)")
    parser.add_argument("--results", type=Path, default=None, help="default: the game's file (risk_episodes)")
    parser.add_argument("--game", choices=list(GAMES), default="calculator")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = args.results or results_path(args.game)
    done = {r["seed"] for r in stored(results, args.game, args.train_prompts)}
    missing = [s for s in args.seeds if s not in done]
    if missing and not args.report_only:
        drafting = Drafting(args.game)
        heldout = list(drafting.task.heldout_records())[: args.heldout]
        with torch.no_grad():
            test = states(drafting, heldout)
            for seed in missing:
                row = one_seed(drafting, seed, args.train_prompts, test, heldout)
                append_row(results, row)
                print(f"seed {seed}: {row['seconds']:.0f} s", flush=True)
    rows = stored(results, args.game, args.train_prompts)
    report([r for r in rows if r["seed"] in args.seeds], args.alpha, args.delta)


if __name__ == "__main__":
    main()
