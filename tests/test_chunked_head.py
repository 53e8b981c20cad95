"""The chunked output head (design §10): exact against full logits, and no vocabulary-wide tensor beyond one chunk.

The model is a small Qwen2 (grouped-query attention, q/k/v bias, tied embeddings) with a prime vocabulary, so a
tensor whose last dimension is the vocabulary cannot be confused with any other shape of the step.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import MethodType

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from lit_grpo.buffers.positions import FirstTokenConstraint
from lit_grpo.errors import InputError
from lit_grpo.policy.logprobs import (
    head_problem,
    logprobs_and_hidden,
    sequence_logprobs,
)
from lit_grpo.policy.model_loading import load_policy
from lit_grpo.policy.packed import TokenLogprobs
from lit_grpo.run.model_files import load_tokenizer
from support import build_char_tokenizer

VOCAB = 997  # prime
CHUNK = 8


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=128)
    torch.manual_seed(0)
    target = tmp_path_factory.mktemp("qwen2-prime")
    Qwen2ForCausalLM(config).save_pretrained(target)
    return target


def test_a_model_directory_without_a_tokenizer_is_refused(qwen_dir):
    with pytest.raises(InputError, match="holds no tokenizer"):  # transformers would build an empty one
        load_tokenizer(str(qwen_dir))


def policy_of(model_dir: Path, checkpointing: bool = False, dtype: str = "float32"):
    """A LoRA policy with random B (a fresh B of 0 would zero every A gradient), in train mode (checkpointing is
    only active in training; dropout is 0, so train and eval forwards agree)."""
    torch.manual_seed(3)  # the same A and B in every policy built from this model
    policy = load_policy(str(model_dir), 4, 8, 0.0, "all-linear", dtype=dtype, gradient_checkpointing=checkpointing)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return policy.train()


def group_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """2 prompts of 5 tokens x 3 completions of 6-9 tokens, right-padded: ids, attention and completion masks."""
    generator = torch.Generator().manual_seed(1)
    ids, attention, completion = [], [], []
    for prompt_index in range(2):
        prompt = torch.randint(0, VOCAB, (5,), generator=generator).tolist()
        for sample in range(3):
            length = 6 + (prompt_index + 2 * sample) % 4
            ids.append(prompt + torch.randint(0, VOCAB, (length,), generator=generator).tolist())
            completion.append([False] * 5 + [True] * length)
    width = max(len(r) for r in ids)
    pad = [lambda r, v: r + [v] * (width - len(r))][0]
    attention = [pad([True] * len(r), False) for r in ids]
    return (torch.tensor([pad(r, 0) for r in ids]), torch.tensor(attention),
            torch.tensor([pad(c, False) for c in completion]))


def full_logits_logprobs(policy, ids, mask, completion, temperature: float) -> torch.Tensor:
    """The reference: every position's full-vocabulary logits, log-softmax, gather; counted tokens only."""
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    logits = policy(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits.float()  # [N, L, V]
    logp = torch.log_softmax(logits[:, :-1] / temperature, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([logp.new_zeros(len(ids), 1), logp], dim=1) * completion


def lora_gradients(policy, logp: torch.Tensor) -> dict[str, torch.Tensor]:
    weights = torch.linspace(-1.0, 1.5, logp.numel()).reshape(logp.shape)  # both signs, like advantages
    policy.zero_grad(set_to_none=True)
    (logp * weights).sum().backward()
    return {name: p.grad.clone() for name, p in policy.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_chunked_equals_full_logits_in_logprobs_and_lora_gradients(qwen_dir, checkpointing, packed):
    ids, mask, completion = group_rows()
    reference_policy = policy_of(qwen_dir)
    expected = full_logits_logprobs(reference_policy, ids, mask, completion, 0.7)
    expected_grads = lora_gradients(reference_policy, expected)
    policy = policy_of(qwen_dir, checkpointing)
    assert policy.is_gradient_checkpointing is checkpointing
    forward = TokenLogprobs(policy, packed=packed, chunk_tokens=CHUNK)
    assert forward.packed is packed
    got = forward(policy, ids, mask, completion, 0.7)
    assert completion.sum() > 3 * CHUNK  # several chunks, the last one partial
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    grads = lora_gradients(policy, got)
    assert grads.keys() == expected_grads.keys() and len(grads) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    for name, reference in expected_grads.items():
        assert reference.norm() > 0, name
        assert (grads[name] - reference).abs().max() <= 1e-5 * max(1.0, reference.abs().max()), name
    assert policy.get_input_embeddings().weight.grad is None  # the frozen tied head/embedding gets no gradient


class VocabTensors(TorchDispatchMode):
    """Records the largest output of any op whose last dimension is the vocabulary (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            new = isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in inputs
            if new and tensor.dim() >= 2 and tensor.shape[-1] == VOCAB:  # a view (the head's transpose) is free
                self.largest = max(self.largest, tensor.numel())
        return out


def saved_vocab_tensors(step) -> list[tuple[int, ...]]:
    """Shapes of the tensors autograd saves for backward whose last dimension is the vocabulary."""
    saved: list[tuple[int, ...]] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dim() >= 2 and tensor.shape[-1] == VOCAB:
            saved.append(tuple(tensor.shape))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return saved


def test_no_vocabulary_tensor_beyond_one_chunk_in_any_pass(qwen_dir):
    ids, mask, completion = group_rows()
    policy = policy_of(qwen_dir, checkpointing=True)
    forward = TokenLogprobs(policy, packed=True, chunk_tokens=CHUNK)
    padded = TokenLogprobs(policy, packed=False, chunk_tokens=CHUNK)
    # the risk rule's forced defer on rows 0 and 3 (decision column 5 restricted to ids 7 and 9)
    allowed = torch.full((len(ids), 2), -1)
    allowed[[0, 3]] = torch.tensor([7, 9])
    constraint = FirstTokenConstraint(torch.full((len(ids),), 5), allowed)

    def training_steps() -> None:
        forward(policy, ids, mask, completion, 0.7).sum().backward()
        padded(policy, ids, mask, completion, 0.7, constraint).sum().backward()
        logp, hidden = logprobs_and_hidden(policy, ids, mask, 0.7, constraint, completion, CHUNK)  # value/risk path
        (logp.sum() + hidden.float().sum()).backward()

    with VocabTensors() as seen:
        assert saved_vocab_tensors(training_steps) == []  # what backward keeps: the chunks' [C, H] inputs only
        forward.batched(policy, ids, mask, completion, 0.7, batch_tokens=10_000)  # pi_old / pi_ref pass
        forward.batched(policy, ids, mask, completion, 0.7, batch_tokens=10_000, constraint=constraint)
    assert 0 < seen.largest <= CHUNK * VOCAB  # with full logits this is rows x positions x vocab


def test_first_token_restriction_is_scored_as_sampled(qwen_dir):
    ids, mask, completion = group_rows()
    policy = policy_of(qwen_dir).eval()
    allowed = torch.full((len(ids), 2), -1)
    allowed[0] = torch.tensor([int(ids[0, 5]), -1])  # row 0: only its own first completion token was allowed
    allowed[1] = torch.tensor([int(ids[1, 5]), 3])  # row 1: its token or id 3
    constraint = FirstTokenConstraint(torch.full((len(ids),), 5), allowed)
    with torch.no_grad():
        free = sequence_logprobs(policy, ids, mask, 1.0, token_mask=completion, chunk_tokens=CHUNK)
        got = sequence_logprobs(policy, ids, mask, 1.0, constraint, completion, CHUNK)
        logits = policy(input_ids=ids[1:2, :5]).logits[0, -1].float()  # [V]: row 1's decision position
    assert got[0, 5].item() == 0.0  # the only allowed id has probability 1
    pair = torch.log_softmax(logits[[int(ids[1, 5]), 3]], -1)[0]
    assert got[1, 5].item() == pytest.approx(pair.item(), abs=1e-6)
    assert torch.equal(got[2:], free[2:]) and torch.equal(got[:2, 6:], free[:2, 6:])  # nothing else moves


def test_bfloat16_base_keeps_lora_and_logprobs_in_float32(qwen_dir):
    policy = policy_of(qwen_dir, checkpointing=True, dtype="bfloat16")
    trained = [p for p in policy.parameters() if p.requires_grad]
    frozen = [p for p in policy.parameters() if not p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    ids, mask, completion = group_rows()
    logp = TokenLogprobs(policy, packed=True, chunk_tokens=CHUNK)(policy, ids, mask, completion, 1.0)
    assert logp.dtype == torch.float32
    reference = full_logits_logprobs(policy_of(qwen_dir), ids, mask, completion, 1.0)
    assert 0 < (logp - reference)[completion].abs().max() < 0.1  # bf16 rounding of the base, not a wrong formula
    logp.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and p.grad.isfinite().all() for p in trained)


def test_a_model_whose_logits_are_not_its_head_is_refused(qwen_dir):
    model = Qwen2ForCausalLM.from_pretrained(qwen_dir)
    assert head_problem(model) is None
    plain_forward = model.forward

    def scaled(self, *args, **kwargs):  # e.g. Cohere's logit_scale, applied after the head
        out = plain_forward(*args, **kwargs)
        out.logits = out.logits * 4.0
        return out

    model.forward = MethodType(scaled, model)
    assert "not its output head applied to its last hidden states" in head_problem(model)


def test_precision_and_chunk_knobs_are_validated_up_front():
    from inspect import signature

    from lit_grpo.policy.module import PolicyModule

    arguments = {k: v.default for k, v in signature(PolicyModule.__init__).parameters.items() if k != "self"}
    arguments.pop("optimizer"), arguments.pop("lr_scheduler")
    assert PolicyModule.config_problems(arguments) == []
    problems = PolicyModule.config_problems(dict(arguments, dtype="int8",
                                                 memory={"logprob_chunk_tokens": 0, "no_grad_batch_tokens": -1}))
    assert problems == [  # the choices (read off the signature's Literal types) first, then the values
        "dtype: unknown value 'int8'; valid choices: auto, float32, bfloat16, float16",
        "memory.no_grad_batch_tokens: must be >= 1, got -1",
        "memory.logprob_chunk_tokens: must be >= 1, got 0",
    ]


def test_policy_module_loads_the_base_in_the_asked_dtype_with_checkpointing(qwen_dir, tmp_path):
    from lit_grpo.policy.module import PolicyModule

    model_dir = tmp_path / "with-tokenizer"
    shutil.copytree(qwen_dir, model_dir)
    build_char_tokenizer().save_pretrained(model_dir)
    module = PolicyModule(model_name_or_path=str(model_dir), dtype="bfloat16",
                          memory={"gradient_checkpointing": True}, lora={"rank": 4})
    module.configure_model()
    assert module.policy.get_input_embeddings().weight.dtype == torch.bfloat16
    assert module.policy.is_gradient_checkpointing
    optimizer = module.configure_optimizers()
    assert all(p.dtype == torch.float32 for group in optimizer.param_groups for p in group["params"])


def test_auto_dtype_is_the_checkpoints_own_when_it_names_a_base_dtype(qwen_dir, tmp_path):
    import json

    from lit_grpo.run.model_files import base_dtype  # a reward model's auto; the policy's: test_dtype_choice.py

    def saved_as(name, **fields):
        path = tmp_path / name
        shutil.copytree(qwen_dir, path)
        config = json.loads((path / "config.json").read_text())
        config.pop("dtype", None), config.pop("torch_dtype", None)
        (path / "config.json").write_text(json.dumps({**config, **fields}))
        return str(path)

    assert base_dtype(saved_as("bf16", dtype="bfloat16"), "auto") == torch.bfloat16
    assert base_dtype(saved_as("old-key", torch_dtype="float16"), "auto") == torch.float16  # older configs
    assert base_dtype(saved_as("f64", dtype="float64"), "auto") == torch.float32  # not a base dtype we train on
    assert base_dtype(saved_as("none"), "auto") == torch.float32
    assert base_dtype(saved_as("asked", dtype="bfloat16"), "float32") == torch.float32  # a named dtype wins
    assert base_dtype(str(tmp_path / "missing"), "auto") == torch.float32  # from_pretrained reports it
    assert base_dtype(str(Path(__file__).parents[1] / "data" / "tiny-qwen2-chat"), "auto") == torch.bfloat16  # the release-shaped model ships bf16
