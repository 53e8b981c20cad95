"""The per-prompt figures of a sampled evaluation (docs/guide.md#sampled-evaluation), as small pure functions: the
unbiased pass@k estimator, exact in integers, the majority vote, and one prompt's row of figures from its ``n``
samples. The policy side averages the rows over the held-out prompts (``lit_grpo.policy.evaluation``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from fractions import Fraction


def pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of the samples drawn without replacement hold a correct
    one; exactly 1 when ``k > n - c`` (every draw of k holds one). Exact (a ``Fraction``). Example: n = 4, c = 1,
    k = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6 = 1/2."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if k > n - c:
        return Fraction(1)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def majority_correct(answers: Sequence[Hashable | None], correct: Sequence[bool]) -> bool:
    """Whether the most common answer is right (maj@n for one prompt): ``answers[i]`` is sample i's extracted answer
    (None: none could be extracted; it does not vote), ``correct[i]`` whether sample i is right. A tie goes to the
    answer given first; no answer at all is wrong. Samples with equal answers are equally right (the task's check
    reads the answer), so the first sample giving the winner decides."""
    votes = Counter(answer for answer in answers if answer is not None)
    if not votes:
        return False
    most = max(votes.values())
    winner = next(answer for answer in answers if answer is not None and votes[answer] == most)
    return bool(correct[answers.index(winner)])


def prompt_row(rewards: Sequence[float], correct: Sequence[bool], failed: Sequence[bool],
               lengths: Sequence[int], ks: Sequence[int], answers: Sequence[Hashable | None] | None = None,
               calls: Sequence[int] | None = None, turns: Sequence[int] | None = None) -> dict[str, float]:
    """One prompt's figures from its ``n`` samples (each sequence holds one value per sample):
    ``mean@n`` (the mean reward, or return), ``pass@k`` for
    each of ``ks``, ``maj@n`` (with ``answers``), ``failed`` (the share whose reward failed or could not be
    scored), ``length`` (mean tokens generated), and with ``calls`` / ``turns`` (episodes) their means as
    ``calls_per_episode`` / ``turns_per_episode``."""
    n = len(rewards)
    row = {f"mean@{n}": math.fsum(rewards) / n}
    row.update({f"pass@{k}": float(pass_at_k(n, sum(map(bool, correct)), k)) for k in ks})
    if answers is not None:
        row[f"maj@{n}"] = float(majority_correct(answers, correct))
    row["failed"] = sum(map(bool, failed)) / n
    row["length"] = sum(lengths) / n
    if calls is not None:
        row["calls_per_episode"] = sum(calls) / n
    if turns is not None:
        row["turns_per_episode"] = sum(turns) / n
    return row
