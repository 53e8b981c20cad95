"""Build data/chat-addition: a small conversational dataset in Parquet, shaped as TRL users bring theirs.

Each row has ``prompt`` (a system message and a user message asking for a two-digit sum), ``solution`` (the sum)
and ``task_id``; ``train.parquet`` holds 240 rows and ``test.parquet`` 60 others. Deterministic (seeded); the
files are small enough to ship. ``configs/trl_style.yaml`` trains on them with ``examples/trl_rewards.py``.

Usage: ``.venv/bin/python scripts/build_chat_dataset.py [--out data/chat-addition]``
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SYSTEM = "You are a calculator. Answer with the number only."


def rows(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pairs = rng.sample([(a, b) for a in range(10, 100) for b in range(10, 100)], count)
    return [{"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{a}+{b}="}],
             "solution": str(a + b), "task_id": f"add-{a}-{b}"} for a, b in pairs]


def main() -> None:
    import datasets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "chat-addition")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    everything = rows(300, seed=0)
    datasets.Dataset.from_list(everything[:240]).to_parquet(args.out / "train.parquet")
    datasets.Dataset.from_list(everything[240:]).to_parquet(args.out / "test.parquet")
    print(f"wrote {args.out}/train.parquet (240 rows) and test.parquet (60 rows)")


if __name__ == "__main__":
    main()
