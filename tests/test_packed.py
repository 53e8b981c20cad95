"""The shared-prefix (packed) forward: its layout by hand, and its log-probs and LoRA gradients against the padded
forward (one row per completion, or per tree node with its ancestors as context) under every allowed kernel."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lit_grpo.policy.logprobs import sequence_logprobs
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.policy.packed import PackLayout, TokenLogprobs, build_layout, packed_logprobs, packing_problem
from lit_grpo.rollout.trees import SegmentNode
from lit_grpo.buffers.tree_layout import tree_rows

SHIPPED_LLAMA = Path(__file__).resolve().parents[1] / "data" / "tiny-llama"
KERNELS = ("eager", "sdpa")  # every attn_implementation PolicyModule accepts


def padded(rows: list[list[int]], contexts: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``completion_mask`` ``[N, L]`` of rows and context lengths."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    completion = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, context) in enumerate(zip(rows, contexts)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
        completion[i, context : len(row)] = True
    return ids, mask, completion


def test_layout_of_a_group_by_hand():
    # prompt [1, 5, 6]; completions [7], [8, 9], [3]: the trie is 1-5-6-{7, 8-9} and a second branch 1-5-3
    # would not share the prompt, so here the third completion follows the prompt: 1-5-6-3
    ids, mask, completion = padded([[1, 5, 6, 7], [1, 5, 6, 8, 9], [1, 5, 6, 3]], [3, 3, 3])
    layout = build_layout(ids, mask, completion)
    assert layout.input_ids.tolist() == [[1, 5, 6, 7, 8, 9, 3]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 3, 4, 3]]
    assert layout.parent.tolist() == [[0, 0, 1, 2, 2, 4, 2]]
    assert layout.has_parent.tolist() == [[False, True, True, True, True, True, True]]
    # token 9 (slot 5) sees 1, 5, 6, 8 and itself, not the sibling branches 7 and 3
    assert layout.ancestors[0, 5].tolist() == [True, True, True, False, True, True, False]
    assert layout.ancestors[0, 6].tolist() == [True, True, True, False, False, False, True]
    assert layout.row_pack.tolist() == [0, 0, 0]
    assert layout.row_slots.tolist() == [[0, 1, 2, 3, 0], [0, 1, 2, 4, 5], [0, 1, 2, 6, 0]]


def test_new_pack_for_another_context_and_at_the_cap():
    # rows 0-1 share the prompt [1, 5]; row 2's prompt [1, 6] differs (sharing only <s>): a pack of its own
    ids, mask, completion = padded([[1, 5, 7], [1, 5, 8], [1, 6, 9, 9]], [2, 2, 2])
    layout = build_layout(ids, mask, completion)
    assert layout.row_pack.tolist() == [0, 0, 1]
    assert layout.input_ids.tolist() == [[1, 5, 7, 8], [1, 6, 9, 9]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 2], [0, 1, 2, 3]]
    # a cap of 3 tokens: row 1 would add a 4th token to pack 0, so it starts pack 1 and repeats the prompt
    capped = build_layout(ids, mask, completion, max_pack_tokens=3)
    assert capped.row_pack.tolist() == [0, 1, 2]
    assert capped.input_ids.tolist() == [[1, 5, 7, 0], [1, 5, 8, 0], [1, 6, 9, 9]]
    assert capped.ancestors[0, 3].tolist() == [False, False, False, True]  # padding sees only itself


def test_attention_bias_is_float_zero_or_dtype_minimum():
    ids, mask, completion = padded([[1, 5, 7], [1, 5, 8]], [2, 2])
    bias = build_layout(ids, mask, completion).attention_bias(torch.float32)
    low = torch.finfo(torch.float32).min
    assert bias.shape == (1, 1, 4, 4) and bias.dtype == torch.float32
    assert bias[0, 0].tolist() == [[0, low, low, low], [0, 0, low, low], [0, 0, 0, low], [0, 0, low, 0]]


def group_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two prompts of 5 and 3 tokens with 4 completions each, some sharing their first tokens, one empty-ish."""
    generator = torch.Generator().manual_seed(7)
    prompts = [[1, 40, 41, 42, 43], [1, 50, 51]]
    rows, contexts = [], []
    for prompt in prompts:
        for length in (1, 3, 5, 6):
            completion = torch.randint(4, 95, (length,), generator=generator).tolist()
            rows.append(prompt + completion)
            contexts.append(len(prompt))
        rows[-1][len(prompt) : len(prompt) + 2] = rows[-2][len(prompt) : len(prompt) + 2]  # a shared completion prefix
    return padded(rows, contexts)


def tree(prompt: list[int], seed: int) -> SegmentNode:
    """A 3-level tree (2 children per node): segments of 2-4 tokens, replies of 1-2 tokens after non-leaves."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(low: int, high: int) -> tuple[int, ...]:
        count = int(torch.randint(low, high + 1, (1,), generator=generator))
        return tuple(torch.randint(4, 95, (count,), generator=generator).tolist())

    root = SegmentNode(context=tuple(prompt))
    level = [root]
    for depth in range(1, 4):
        next_level = []
        for parent in level:
            context = parent.context + parent.segment + parent.reply
            for _ in range(2):
                child = SegmentNode(context=context, segment=tokens(2, 4), reply=tokens(1, 2) if depth < 3 else (),
                                    terminal=depth == 3)
                parent.children.append(child)
                next_level.append(child)
        level = next_level
    return root


def tree_rows_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = tree_rows([tree([1, 40, 41, 42], seed=1), tree([1, 50, 51], seed=2)], pad_id=0)
    assert rows["input_ids"].shape[0] == 28  # 14 policy nodes per tree
    return rows["input_ids"], rows["attention_mask"], rows["completion_mask"]


@pytest.fixture(scope="module", params=["llama", "gpt2", "shipped-llama"])
def model_dir(request, tiny_llama_dir, tiny_gpt2_dir) -> Path:
    return {"llama": tiny_llama_dir, "gpt2": tiny_gpt2_dir, "shipped-llama": SHIPPED_LLAMA}[request.param]


def lora_policy(model_dir: Path, kernel: str):
    """A LoRA policy with non-zero random B (a fresh adapter's B is 0, which would zero every A gradient), in eval
    mode so GPT-2's dropout does not make the two forwards differ."""
    policy = load_policy(str(model_dir), 8, 16, 0.0, "all-linear", attn_implementation=kernel)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return policy.eval()


def lora_gradients(policy, logp: torch.Tensor, completion_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients of a weighted sum of the counted log-probs (weights of both signs, like advantages)."""
    weights = torch.linspace(-1.0, 1.5, logp.numel()).reshape(logp.shape)  # [N, L]
    policy.zero_grad()
    (logp * weights * completion_mask).sum().backward()
    return {name: p.grad.clone() for name, p in policy.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("rows", [group_rows, tree_rows_tensors], ids=["group", "tree"])
def test_packed_equals_padded_logprobs_and_lora_gradients(model_dir, kernel, rows):
    policy = lora_policy(model_dir, kernel)
    ids, mask, completion = rows()
    expected = sequence_logprobs(policy, ids, mask, 0.7, token_mask=completion)  # [N, L], one padded row per row
    expected_grads = lora_gradients(policy, expected, completion)
    got = packed_logprobs(policy, ids, mask, completion, 0.7)
    grads = lora_gradients(policy, got, completion)
    layout = build_layout(ids, mask, completion)
    assert layout.row_pack.max() == 1  # one pack per group / tree: the prefixes really are shared
    assert layout.input_ids.numel() < mask.sum()  # fewer token slots than the padded rows' real tokens
    assert got.shape == expected.shape
    assert (got[~completion] == 0).all() and (got[completion] != 0).all()  # counted tokens only
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert len(grads) == len(expected_grads) > 0
    for name, reference in expected_grads.items():
        assert reference.norm() > 0, name
        relative = (grads[name] - reference).norm() / reference.norm()
        assert relative <= 1e-4, f"{name}: relative gradient error {relative:.2e}"


def test_pack_cap_splits_a_tree_and_stays_exact(tiny_llama_dir):
    policy = lora_policy(tiny_llama_dir, "sdpa")
    ids, mask, completion = tree_rows_tensors()
    with torch.no_grad():
        expected = sequence_logprobs(policy, ids, mask, 1.0, token_mask=completion)
        got = packed_logprobs(policy, ids, mask, completion, 1.0, max_pack_tokens=40)
    assert build_layout(ids, mask, completion, max_pack_tokens=40).row_pack.max() > 1
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_token_logprobs_batched_matches_padded_in_chunks(tiny_llama_dir):
    policy = lora_policy(tiny_llama_dir, "eager").train()
    ids, mask, completion = group_rows()
    forward = TokenLogprobs(policy, packed=True)
    assert forward.packed
    # 3 rows per forward: the chunks split the groups, still exact
    got = forward.batched(policy, ids, mask, completion, 0.7, batch_tokens=3 * ids.shape[1])
    assert policy.training  # restored after the eval-mode pass
    with torch.no_grad():
        expected = sequence_logprobs(policy.eval(), ids, mask, 0.7, token_mask=completion)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_probe_catches_a_boolean_mask_under_eager(tiny_llama_dir, monkeypatch, caplog):
    # eager attention adds the mask to the scores: a boolean mask adds 1 or 0 and gives wrong logits (design §9)
    policy = lora_policy(tiny_llama_dir, "eager")
    monkeypatch.setattr(PackLayout, "attention_bias", lambda self, dtype: self.ancestors.unsqueeze(1))
    assert "differ from the padded forward" in packing_problem(policy)
    with caplog.at_level(logging.INFO):
        forward = TokenLogprobs(policy, packed=True)
    assert not forward.packed
    assert "packed_forward: using the padded forward instead" in caplog.text


def test_unsupported_kernel_and_flag_off_use_the_padded_forward(tiny_llama_dir):
    policy = lora_policy(tiny_llama_dir, "sdpa")
    assert not TokenLogprobs(policy, packed=False).packed
    policy.config._attn_implementation = "flash_attention_2"
    assert "does not take a custom 4-D mask" in packing_problem(policy)


def test_packed_forward_flag_is_validated():
    from inspect import signature

    from lit_grpo.policy.module import PolicyModule

    arguments = {k: v.default for k, v in signature(PolicyModule.__init__).parameters.items() if k != "self"}
    arguments.pop("optimizer"), arguments.pop("lr_scheduler")
    assert arguments["memory"].packed_forward is True
    assert PolicyModule.config_problems(arguments) == []
    problems = PolicyModule.config_problems(dict(arguments, memory={"packed_forward": "yes"}))
    assert problems == ["memory.packed_forward: must be true or false, got 'yes'"]


@pytest.mark.parametrize("packed_forward", [True, False])
def test_policy_module_chooses_its_forward_once(tiny_gpt2_dir, packed_forward):
    from lit_grpo.policy.module import PolicyModule

    module = PolicyModule(model_name_or_path=str(tiny_gpt2_dir), memory={"packed_forward": packed_forward},
                          attn_implementation="eager")
    module.configure_model()
    assert module.token_logprobs.packed is packed_forward
