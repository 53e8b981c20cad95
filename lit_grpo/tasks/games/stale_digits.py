"""A game where *when to stop asking* is the hard part: stale digits behind a cue that predicts them only partly."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from lit_grpo.errors import InputError
from lit_grpo.tasks.base import PromptRecord
from lit_grpo.tasks.episodes import EnvStep
from lit_grpo.tasks.games.ask_or_answer import AskOrAnswerTask

NAMES = ("a", "b", "c")  # the digits, revealed in this order
CUES = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Rules:
    """The numbers the oracle needs: rewards, costs and the chance that a digit is stale."""

    correct_reward: float
    wrong_reward: float
    ask_cost: float
    idle_ask_cost: float


@cache
def best_actions(rules: Rules, stale_probability: float, digits: int = len(NAMES)) -> tuple[tuple[str, float], ...]:
    """The Bayes-optimal action and its expected return with ``k`` digits still unchecked, for k = 0..digits.

    With ``k`` unchecked digits, each stale with probability p (q = 1 - p) independently:
    - answering with the values known now is right iff none of the k is stale:
      ``R_c q^k + R_w (1 - q^k)``;
    - asking reveals the first stale one among them, the j-th with probability ``q^(j-1) p``, costing ``ask_cost``
      and leaving ``k - j`` unchecked; with probability ``q^k`` none is stale: the reply is ``none;``, it costs
      ``idle_ask_cost`` and the answer is then right: ``R_c - idle_ask_cost``.
    Ties go to answering (the cheaper episode). ``V(0) = R_c`` (everything is known).
    """
    p, q = stale_probability, 1.0 - stale_probability
    table: list[tuple[str, float]] = [("answer", rules.correct_reward)]
    for k in range(1, digits + 1):
        answer = rules.correct_reward * q**k + rules.wrong_reward * (1 - q**k)
        ask = sum(q ** (j - 1) * p * (table[k - j][1] - rules.ask_cost) for j in range(1, k + 1))
        ask += q**k * (rules.correct_reward - rules.idle_ask_cost)
        table.append(("ask", ask) if ask > answer else ("answer", answer))
    return tuple(table)


class StaleDigitsTask(AskOrAnswerTask):
    """Recover a code of three digits ``abc`` shown in the prompt, each of which may be *stale* (wrong), with a
    probability that depends on the prompt's cue letter (``A``..``D``, ``stale_probabilities``): ``C 641=``. The
    cue predicts how many digits are stale only partly, and nothing in the prompt says which.

    A segment ``?`` asks: the environment replies with the true value of the next stale digit (in the order a, b,
    c; ``b=9;``), which also says that the digits before it were right, and costs ``ask_cost``; when no stale digit
    is left it replies ``none;`` and the question costs ``idle_ask_cost`` (asking when nothing is hidden is
    penalised). A segment of digits answers: ``correct_reward`` if it is the true code (``691``), else
    ``wrong_reward``. Episodes run up to 4 rounds (three questions reveal everything). The skill, copying the digits
    with the revealed ones put in, is easy for the warm start: what is hard is when to stop asking.

    The oracle is the best policy given what the cue and the replies show, computed exactly from the game's
    probabilities (``best_actions``), not one that sees which digits are stale: at cue ``A`` it answers at once,
    at ``B`` it asks once and then answers whatever the reply, at ``C`` and ``D`` it asks until every digit is
    checked. So its number of questions is 0, 1, 2 or 3 and depends on the replies.

    Args:
        stale_probabilities: the chance that each digit is stale, per cue ``A``, ``B``, ``C``, ``D``.
        correct_reward: reward of a right answer.
        wrong_reward: reward of a wrong answer.
        ask_cost: cost of a question that reveals a stale digit.
        idle_ask_cost: cost of a question answered ``none;`` (nothing stale was left).
        malformed_reward: reward of a segment that is neither an answer nor ``?``.
        no_answer_reward: reward of an episode closed at ``max_depth`` without an answer.
        heldout_size: held-out prompts; their codes never occur in training, nor their texts (``unshared``). The
            codes are divided: the records of the first half of the held-out codes (rounded up) validate, the rest
            test.
        split_seed: seed of the split, of which digits are stale and of the stale values.
        train_order_seed: when set, the training prompts are shuffled with this seed (the same prompts, another
            order: each seed of a benchmark sees its own order); ``None`` keeps the split's order.
        use_chat_template: see ``Task``.
        max_rounds: rounds an episode runs at most (three questions reveal every digit, and a fourth round answers);
            a tree's ``data.branching`` names one width per round.
    """

    def __init__(
        self,
        stale_probabilities: tuple[float, float, float, float] = (0.02, 0.1, 0.25, 0.6),
        correct_reward: float = 1.0,
        wrong_reward: float = -1.0,
        ask_cost: float = 0.1,
        idle_ask_cost: float = 0.5,
        malformed_reward: float = -1.0,
        no_answer_reward: float = -0.5,
        heldout_size: int = 500,
        split_seed: int = 0,
        train_order_seed: int | None = None,
        use_chat_template: bool = False,
        max_rounds: int = 4,
    ) -> None:
        if len(stale_probabilities) != len(CUES) or not all(0 <= p <= 1 for p in stale_probabilities):
            raise InputError(f"StaleDigitsTask: stale_probabilities must be {len(CUES)} probabilities, got "
                             f"{list(stale_probabilities)}")
        if idle_ask_cost < ask_cost:
            raise InputError(f"idle_ask_cost ({idle_ask_cost}) must be at least ask_cost ({ask_cost})")
        super().__init__(correct_reward, wrong_reward, ask_cost, malformed_reward, no_answer_reward, heldout_size,
                         split_seed, use_chat_template, max_rounds)
        self.stale_probabilities = tuple(stale_probabilities)
        self.train_order_seed = train_order_seed
        self.rules = Rules(correct_reward, wrong_reward, ask_cost, idle_ask_cost)

    def split(self) -> tuple[list[PromptRecord], list[PromptRecord], list[PromptRecord]]:
        """Every code of digits 1..9 under every cue, staleness drawn per record; held out by code, and the held-out
        codes divided between validation and test (a code's four cues on one side). A held-out record whose text a
        training prompt has is redrawn (``unshared``); the training prompts are those of before that rule."""
        rng = random.Random(self.split_seed)
        triples = list(itertools.product(range(1, 10), repeat=len(NAMES)))
        rng.shuffle(triples)
        heldout_triples = -(-self.heldout_size // len(CUES))
        records = [[self.draw(list(t), cue, rng) for cue in CUES] for t in triples]
        heldout = [r for group in records[:heldout_triples] for r in group][: self.heldout_size]
        train = [r for group in records[heldout_triples:] for r in group]
        rng.shuffle(heldout)
        rng.shuffle(train)
        validation_codes = triples[: -(-heldout_triples // 2)]
        test_codes = triples[len(validation_codes):heldout_triples]
        heldout = self.unshared(heldout, {r["prompt"] for r in train}, validation_codes, test_codes)
        if self.train_order_seed is not None:
            random.Random(self.train_order_seed).shuffle(train)
        validation = [r for r in heldout if tuple(r["digits"]) in set(validation_codes)]
        return train, validation, [r for r in heldout if tuple(r["digits"]) not in set(validation_codes)]

    def unshared(self, heldout: list[PromptRecord], train_texts: set[str], validation_codes: list[tuple[int, ...]],
                 test_codes: list[tuple[int, ...]]) -> list[PromptRecord]:
        """``heldout`` with every record whose text is a training prompt's replaced by one that is no training
        prompt's, keeping its cue, which digits are stale (so the oracle's return is unchanged) and its side of the
        validation/test division: first its own code with the stale digits' shown values redrawn, then (a record
        with nothing stale shows its own code, so only another code can help) other codes of its side.

        Why: a stale code can show any digits, so 187 of the 500 held-out texts were a training prompt's (with
        another answer). Draws come from their own generator, so the training prompts and the held-out records
        that were not shared are exactly as before."""
        rng = random.Random(f"{self.split_seed}:unshared")
        side = {code: codes for codes in (validation_codes, test_codes) for code in codes}
        kept = []
        for record in heldout:
            attempt = 0
            while record["prompt"] in train_texts:
                own = tuple(record["digits"])
                digits = list(own) if attempt < 20 else list(rng.choice(side[own]))
                shown = [rng.choice([d for d in range(1, 10) if d != x]) if name in record["stale"] else x
                         for name, x in zip(NAMES, digits)]
                record, attempt = self.record(digits, shown, record["cue"]), attempt + 1
            kept.append(record)
        return kept

    def draw(self, digits: list[int], cue: str, rng: random.Random) -> PromptRecord:
        p = self.stale_probabilities[CUES.index(cue)]
        stale = [name for name in NAMES if rng.random() < p]
        shown = [rng.choice([d for d in range(1, 10) if d != x]) if name in stale else x
                 for name, x in zip(NAMES, digits)]
        return self.record(digits, shown, cue)

    @staticmethod
    def record(digits: Sequence[int], shown: Sequence[int], cue: str) -> PromptRecord:
        """The record of the true ``digits`` shown as ``shown`` under ``cue`` (a digit is stale where they
        differ)."""
        stale = [name for name, x, s in zip(NAMES, digits, shown) if x != s]
        return {"prompt": f"{cue} " + "".join(map(str, shown)) + "=", "answer": "".join(map(str, digits)),
                "digits": list(digits), "shown": list(shown), "stale": stale, "cue": cue}

    def reply(self, prompt_record: PromptRecord, round_index: int) -> str:
        """Every earlier segment of a running episode was a question, so this is question ``round_index``: it
        reveals the ``round_index``-th stale digit, or ``none;``."""
        stale = prompt_record["stale"]
        if round_index > len(stale):
            return "none;"
        name = stale[round_index - 1]
        return f"{name}={prompt_record['digits'][NAMES.index(name)]};"

    def step(self, prompt_record: PromptRecord, round_index: int, segment_text: str) -> EnvStep:
        taken = super().step(prompt_record, round_index, segment_text)
        if taken.kind == "ask" and taken.reply == "none;":
            return EnvStep("ask", -self.rules.idle_ask_cost, terminal=False, reply=taken.reply)
        return taken

    def oracle_episode(self, record: PromptRecord) -> tuple[int, float]:
        """The oracle's questions on ``record`` and its return: it follows ``best_actions`` for the record's cue,
        counting the digits not yet checked from what the replies showed."""
        actions = best_actions(self.rules, self.stale_probabilities[CUES.index(record["cue"])])
        unchecked, questions, spent = len(NAMES), 0, 0.0
        while actions[unchecked][0] == "ask":
            questions += 1
            reply = self.reply(record, questions)
            if reply == "none;":
                spent, unchecked = spent + self.rules.idle_ask_cost, 0
            else:
                spent += self.rules.ask_cost
                unchecked = len(NAMES) - 1 - NAMES.index(reply[0])
        right = questions >= len(record["stale"])  # each question revealed one stale digit or said none is left
        return questions, (self.correct_reward if right else self.wrong_reward) - spent

    def oracle_questions(self, record: PromptRecord) -> int:  # type: ignore[override]
        return self.oracle_episode(record)[0]

    def oracle_return(self, records: Sequence[PromptRecord]) -> float:
        return sum(self.oracle_episode(r)[1] for r in records) / len(records)

    def informed_questions(self, record: PromptRecord) -> int:
        """Questions after which every stale digit is revealed: the answer then depends on skill only."""
        return len(record["stale"])
