"""Build data/addition-eval/one-digit.jsonl: a held-out evaluation file for the quickstart's task, 48 additions with
one single-digit operand (``"7+45="``, ``"45+7="``), which ``ArithmeticTask``'s two-digit operands (10..99) never
give, so no prompt is a training prompt. Each row has ``prompt`` and ``answer`` (the sum, as text). Deterministic
(seeded). ``configs/quickstart_eval_sets.yaml`` scores it beside the task's validation split
(docs/guide.md#named-evaluation-sets).

Usage: ``.venv/bin/python scripts/build_addition_eval.py [--out data/addition-eval/one-digit.jsonl]``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(count: int, seed: int) -> list[dict[str, str]]:
    """``count`` distinct additions of a one-digit and a two-digit number, in either order."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(1, 10) for b in range(10, 100)] + [(b, a) for a in range(1, 10)
                                                                      for b in range(10, 100)]
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in rng.sample(pairs, count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / "data" / "addition-eval" / "one-digit.jsonl"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows(48, seed=0)))
    print(f"wrote {args.out} (48 rows)")


if __name__ == "__main__":
    main()
