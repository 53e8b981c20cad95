"""Every random stream of a run has its own seed (issue 18, bug 5): epochs, DAPO draws, tree rounds and the
exploring and rule-following trees of one epoch."""

from __future__ import annotations

from types import SimpleNamespace

from lit_grpo.engines import SamplingSpec
from lit_grpo.rollout import trees as trees_module
from lit_grpo.rollout.datamodule import RolloutDataModule
from lit_grpo.run.seeds import derived_seed


def test_a_derived_seed_is_a_fixed_62_bit_hash_of_its_path():
    assert derived_seed(0, 1, "round", 2) == derived_seed(0, 1, "round", 2)
    assert 0 <= derived_seed(0) < 2**62
    assert derived_seed(1, 0) != derived_seed(0, 1) and derived_seed(0, "1") != derived_seed(0, 1)


def test_derived_seeds_keep_their_values():
    # Computed once outside the project, from the definition: the top 62 bits of the 8-byte blake2b digest of the
    # path as "int:0/int:1/str:round/int:2" (e.g. python3 -c "import hashlib; print(int.from_bytes(hashlib.blake2b(
    # b'int:0/int:1/str:round/int:2', digest_size=8).digest(), 'big') >> 2)"). These values are every run's
    # sampling and minibatch order: if they change, a checkpoint resumed with the new code no longer continues
    # the run it came from, and no run repeats an earlier one.
    assert derived_seed(0) == 3355744460080962136
    assert derived_seed(0, 1, "round", 2) == 410445670212431917
    assert derived_seed(1234, 7, "draw", 1) == 2221910153276346411
    data = RolloutDataModule(seed=0)  # an epoch's streams are (run seed, epoch, stream name)
    assert data.epoch_seed(3) == derived_seed(0, 3, "rollout") == 1858577636918890393
    assert data.epoch_seed(0, "shuffle") == derived_seed(0, 0, "shuffle") == 2710676881257331573


def test_no_two_streams_of_a_run_share_a_request_seed():
    data = RolloutDataModule(seed=0)
    seen: dict[int, tuple] = {}
    for epoch in range(40):
        base = data.epoch_seed(epoch)
        bases = {("shuffle",): data.epoch_seed(epoch, "shuffle")}
        bases |= {("draw", d): derived_seed(base, "draw", d) for d in range(1, 4)}
        bases |= {("round", r): derived_seed(base, "round", r) for r in range(4)}
        for stream, start in bases.items():
            for request in range(200):  # an engine seeds request i with base + i
                key = (epoch, *stream, request)
                assert seen.setdefault(start + request, key) == key, (seen[start + request], key)
    # the old strides: epoch 0 round 2 was epoch 1 round 1
    assert derived_seed(data.epoch_seed(0), "round", 2) != derived_seed(data.epoch_seed(1), "round", 1)


def test_the_rule_following_trees_continue_the_exploring_trees_request_seeds(monkeypatch):
    data = RolloutDataModule(seed=0)
    data.prompts.share_start = 0
    calls = []
    monkeypatch.setattr(trees_module, "expand_trees",
                        lambda task, engine, tok, records, widths, sampling, rule=None, request_offset=0,
                        reward_context=None: calls.append((list(records), sampling.seed + request_offset, rule)) or [])
    monkeypatch.setattr(data.risk_threshold, "at", lambda module, epoch, training: "rule")
    data.trainer = SimpleNamespace(current_epoch=0)
    data.use_risk_threshold(SimpleNamespace(explore_fraction=0.25, decision="threshold"))
    data.grow_trees(SimpleNamespace(tokenizer=None), list("abcdefgh"), [2, 1], SamplingSpec(8, 1.0, seed=1000))
    # prompts a, b explore from seed 1000 (requests 1000, 1001); c..h follow the rule from 1002, not 1000 again
    assert calls == [(["a", "b"], 1000, None), (list("cdefgh"), 1002, "rule")]
