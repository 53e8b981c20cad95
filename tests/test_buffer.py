"""build_buffer's layout; serve_minibatches' grouping, repetition, trimming, step denominators (design §2, §5)."""

import pytest
import torch

from lit_grpo.buffers.buffer import build_buffer, serve_minibatches
from lit_grpo.engines import Completion

PAD = 7  # a pad id no prompt or completion below uses, so a misplaced pad shows


def completion(ids, logprobs, finish):
    return Completion(tuple(ids), None if logprobs is None else tuple(logprobs), finish)


# two prompts of lengths 3 and 2, two completions each, of lengths 3, 4 | 1, 3 (2 is the stop token)
PROMPTS = [[1, 10, 11], [1, 20]]
GROUPS = [
    [
        completion([30, 31, 2], [-0.1, -0.2, -0.3], "stop"),
        completion([32, 33, 34, 35], [-0.4, -0.5, -0.6, -0.7], "length"),
    ],
    [
        completion([2], [-0.8], "stop"),  # an empty answer: only the stop token, which still counts
        completion([40, 41, 2], [-0.9, -1.0, -1.1], "stop"),
    ],
]


def test_build_buffer_layout():
    buffer = build_buffer(PROMPTS, GROUPS, pad_id=PAD, temperature=0.7, max_new_tokens=4)
    # rows are prompt + completion, right-padded to the longest (3 + 4 = 7)
    assert torch.equal(
        buffer.input_ids,
        torch.tensor(
            [
                [1, 10, 11, 30, 31, 2, PAD],
                [1, 10, 11, 32, 33, 34, 35],
                [1, 20, 2, PAD, PAD, PAD, PAD],
                [1, 20, 40, 41, 2, PAD, PAD],
            ]
        ),
    )
    assert torch.equal(
        buffer.attention_mask.int(),
        torch.tensor([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]]),
    )
    # True exactly on the completion tokens, the stop token included; never on prompt or padding
    assert torch.equal(
        buffer.completion_mask.int(),
        torch.tensor([[0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 0, 0]]),
    )
    assert buffer.attention_mask.dtype == torch.bool and buffer.completion_mask.dtype == torch.bool
    expected_logp = torch.tensor(
        [
            [0, 0, 0, -0.1, -0.2, -0.3, 0],
            [0, 0, 0, -0.4, -0.5, -0.6, -0.7],
            [0, 0, -0.8, 0, 0, 0, 0],
            [0, 0, -0.9, -1.0, -1.1, 0, 0],
        ]
    )
    assert torch.equal(buffer.sampler_logp, expected_logp)  # placed at the completion's columns, 0 elsewhere
    assert torch.equal(buffer.truncated, torch.tensor([False, True, False, False]))  # finish_reason "length"
    assert buffer.group_size == 2 and buffer.num_groups == 2
    assert torch.equal(buffer.completion_lengths, torch.tensor([3, 4, 1, 3]))
    assert buffer.temperature == 0.7 and buffer.max_new_tokens == 4
    assert torch.equal(buffer.rewards, torch.zeros(4))  # the caller scores them
    assert buffer.old_logp is None and buffer.ref_logp is None and buffer.advantages is None


def test_build_buffer_without_sampler_logprobs():
    groups = [[GROUPS[0][0], completion([32], None, "stop")]]
    buffer = build_buffer(PROMPTS[:1], groups, pad_id=PAD, temperature=1.0, max_new_tokens=4)
    assert buffer.sampler_logp is None  # one engine row without log-probs: the trainer computes pi_old instead
    assert torch.equal(buffer.input_ids, torch.tensor([[1, 10, 11, 30, 31, 2], [1, 10, 11, 32, PAD, PAD]]))


# --- serving ----------------------------------------------------------------------------------------------------
# three groups of two; counted (completion) tokens per group: g0 1 + 2 = 3, g1 2 + 3 = 5, g2 4 + 4 = 8
SERVE_PROMPTS = [[1, 10], [1, 20, 21], [1]]
SERVE_LENGTHS = [[1, 2], [2, 3], [4, 4]]
ROW_TOKENS = [1, 2, 2, 3, 4, 4]  # counted tokens per row
ROW_WIDTH = [3, 4, 5, 6, 5, 5]  # prompt + completion per row
GROUP_TOKENS = [3, 5, 8]
MAX_NEW = 4


def serve_buffer(advantages_2d: bool = False):
    groups = [
        [completion(range(50, 50 + n), [-0.5] * n, "length" if n == MAX_NEW else "stop") for n in lengths]
        for lengths in SERVE_LENGTHS
    ]
    buffer = build_buffer(SERVE_PROMPTS, groups, pad_id=PAD, temperature=1.0, max_new_tokens=MAX_NEW)
    rows = torch.arange(6, dtype=torch.float)
    # advantages carry the row index, so every minibatch says which rows it holds
    buffer.advantages = rows[:, None].expand(6, buffer.input_ids.shape[1]).clone() if advantages_2d else rows
    buffer.old_logp = buffer.sampler_logp.clone()
    return buffer


def served_rows(batch):
    adv = batch["advantages"]
    return [int(a) for a in (adv[:, 0] if adv.dim() == 2 else adv)]


def test_minibatches_hold_whole_groups_and_every_row_ppo_epochs_times():
    buffer = serve_buffer()
    batches = serve_minibatches(buffer, 2, 3, 1, "seq-mean", torch.Generator().manual_seed(0))
    assert len(batches) == 9  # 3 groups, one per minibatch, 3 passes
    counts = [0] * 6
    for index, batch in enumerate(batches):
        rows = served_rows(batch)
        assert len(rows) == 2 and rows[0] % 2 == 0 and rows[1] == rows[0] + 1  # one whole group, rows in order
        for row in rows:
            counts[row] += 1
    assert counts == [3] * 6
    for epoch in range(3):  # each pass is a permutation of the groups
        assert sorted(served_rows(b)[0] // 2 for b in batches[3 * epoch : 3 * epoch + 3]) == [0, 1, 2]


def test_minibatch_of_several_groups():
    buffer = serve_buffer()
    batches = serve_minibatches(buffer, 4, 2, 1, "token-mean", torch.Generator().manual_seed(0))
    # 2 groups per minibatch: each pass is one minibatch of 2 groups and a last one of the remaining group
    assert [len(served_rows(b)) for b in batches] == [4, 2, 4, 2]
    for batch in batches:
        rows = served_rows(batch)
        assert sorted(rows) == sorted({2 * (r // 2) for r in rows} | {2 * (r // 2) + 1 for r in rows})


def test_minibatches_are_deterministic_for_a_seed():
    buffer = serve_buffer()

    def order(seed):
        batches = serve_minibatches(buffer, 2, 2, 1, "seq-mean", torch.Generator().manual_seed(seed))
        return [served_rows(b) for b in batches]

    assert order(0) == order(0)
    assert any(order(0) != order(seed) for seed in (1, 2, 3))  # the generator drives the shuffle


def test_minibatches_are_trimmed_to_their_longest_row():
    buffer = serve_buffer(advantages_2d=True)
    buffer.ref_logp = buffer.sampler_logp - 1.0
    assert buffer.input_ids.shape[1] == 6
    for batch in serve_minibatches(buffer, 2, 1, 1, "seq-mean", torch.Generator().manual_seed(0)):
        rows = served_rows(batch)
        width = max(ROW_WIDTH[r] for r in rows)  # g0 -> 4, g1 -> 6, g2 -> 5
        assert width == {0: 4, 1: 6, 2: 5}[rows[0] // 2]
        index = torch.tensor(rows)
        for key, full in [
            ("input_ids", buffer.input_ids),
            ("attention_mask", buffer.attention_mask),
            ("completion_mask", buffer.completion_mask),
            ("old_logp", buffer.old_logp),
            ("ref_logp", buffer.ref_logp),
            ("advantages", buffer.advantages),
        ]:
            assert torch.equal(batch[key], full[index, :width]), key
        assert batch["temperature"].item() == 1.0 and batch["max_new_tokens"].item() == MAX_NEW


def test_no_ref_logp_key_without_reference():
    buffer = serve_buffer()
    batch = serve_minibatches(buffer, 2, 1, 1, "seq-mean", torch.Generator().manual_seed(0))[0]
    assert "ref_logp" not in batch


@pytest.mark.parametrize(
    "aggregation, first_step, last_step",
    [
        # 3 minibatches of one group each, accumulate 2: the first step holds minibatches 0 and 1 (two groups), the
        # second only minibatch 2 (the short last step). `last` is the group served third.
        ("seq-mean", lambda last: 4, lambda last: 2),  # rows: 2 + 2, then 2
        ("token-mean", lambda last: 16 - GROUP_TOKENS[last], lambda last: GROUP_TOKENS[last]),  # 3 + 5 + 8 = 16 total
        ("constant", lambda last: 4 * MAX_NEW, lambda last: 2 * MAX_NEW),  # rows * max_new_tokens: 16, then 8
    ],
    ids=["seq-mean", "token-mean", "constant"],
)
def test_step_denominator_with_accumulation_and_short_last_step(aggregation, first_step, last_step):
    buffer = serve_buffer()
    batches = serve_minibatches(buffer, 2, 1, 2, aggregation, torch.Generator().manual_seed(0))
    assert len(batches) == 3
    last = served_rows(batches[2])[0] // 2
    assert batches[0]["step_denominator"].item() == first_step(last)
    assert batches[1]["step_denominator"].item() == first_step(last)
    assert batches[2]["step_denominator"].item() == last_step(last)


def test_step_denominator_token_mean_is_the_step_total_for_every_order():
    # 2 passes x 3 minibatches = 6 minibatches, accumulate 4: steps [0-3] and [4-5], whatever groups they hold
    buffer = serve_buffer()
    for seed in range(4):
        batches = serve_minibatches(buffer, 2, 2, 4, "token-mean", torch.Generator().manual_seed(seed))
        tokens = [sum(ROW_TOKENS[r] for r in served_rows(b)) for b in batches]
        assert tokens == [int(b["completion_mask"].sum()) for b in batches]
        for index, batch in enumerate(batches):
            step = range(0, 4) if index < 4 else range(4, 6)
            assert batch["step_denominator"].item() == sum(tokens[i] for i in step)


def test_step_denominator_without_accumulation_is_the_minibatch_count():
    buffer = serve_buffer()
    for batch in serve_minibatches(buffer, 2, 1, 1, "token-mean", torch.Generator().manual_seed(0)):
        assert batch["step_denominator"].item() == GROUP_TOKENS[served_rows(batch)[0] // 2]


def test_completion_lengths_count_a_masked_truncated_row_as_max_new_tokens():
    groups = [[completion([30, 2], None, "stop"), completion([31, 32, 33], None, "length")]]
    buffer = build_buffer([[1, 10]], groups, PAD, 1.0, 3)
    assert buffer.completion_lengths.tolist() == [2, 3]
    buffer.completion_mask[buffer.truncated] = False  # mask_truncated: the cut-off row carries no loss
    assert buffer.completion_lengths.tolist() == [2, 3]  # it was 0 tokens long in rollout/completion_length
