"""Seeds of the random streams of a run, derived so that no two streams share one.

Offsets by a prime stride collided (epoch 0 round 2 and epoch 1 round 1 were both base + 2 x 7919, and the
exploring and rule-following trees of an epoch restarted at the same request seeds). Each stream's base seed is a
hash of its whole path (run seed, epoch, stream name, draw or round): 62 bits, so that an engine adding a request's
index to it (``seed + i``, as every engine does) stays far from every other stream's range.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 62  # below 2**63: a signed 64-bit seed for torch, vLLM and the server's JSON


def derived_seed(*path: int | str) -> int:
    """A seed in ``[0, 2**62)`` for the stream named by ``path`` (ints and names, e.g. ``(0, 3, "round", 1)``);
    equal paths give equal seeds, different paths different ones (up to a 2**-62 chance)."""
    text = "/".join(f"{type(part).__name__}:{part}" for part in path)
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)
