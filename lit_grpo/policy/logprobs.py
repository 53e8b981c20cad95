"""Per-token log-probs of given sequences under a causal LM: the one place they are computed
(docs/guide.md#your-own-model).

A forward never builds logits for every position: the model's body gives the last hidden states ``[N, L, H]``;
only the positions whose token is wanted (the completion tokens) go through the output head, in chunks of
``chunk_tokens`` tokens, each chunk's ``[C, V]`` logits cast to fp32 for the log-softmax and recomputed in backward
(non-reentrant checkpoint) instead of being kept. So no tensor with the vocabulary as a dimension is larger than one
chunk, whatever the number of rows, their length or the vocabulary. The frozen (possibly tied) head gets no weight
gradient: only the hidden states it is applied to do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from lit_grpo.buffers.positions import FirstTokenConstraint, padded_positions

CHUNK_TOKENS = 256  # tokens per output-head chunk: 256 x 151,936 fp32 logits is 156 MB


def restrict_to_allowed(logits: torch.Tensor, allowed_ids: torch.Tensor) -> torch.Tensor:
    """``logits [M, V]`` with every id outside a constrained row's ``allowed_ids [M, C]`` (-1 padding; a row of
    only -1 is unconstrained) set to -inf, so log-softmax renormalises over the allowed ids, as the sampler did.

    Example: a row allowed [7] keeps only id 7, whose log-prob becomes 0.
    """
    constrained = (allowed_ids >= 0).any(dim=1)  # [M]
    if not constrained.any():
        return logits
    vocab = logits.shape[-1]
    target = torch.where(allowed_ids >= 0, allowed_ids, vocab)  # [M, C]: padding goes to a spare column, dropped
    keep = torch.zeros(logits.shape[0], vocab + 1, dtype=torch.bool, device=logits.device)
    keep = keep.scatter(1, target.to(logits.device), True)[:, :vocab]  # [M, V]
    keep |= ~constrained[:, None].to(logits.device)
    return logits.masked_fill(~keep, float("-inf"))


class TokenLogSoftmax(torch.autograd.Function):
    """``logits[m, target_m] - logsumexp(logits[m])`` for ``logits [M, V]``, ``targets [M]`` -> ``[M]``, whose
    backward holds one ``[M, V]`` tensor beside the saved logits: the gradient ``grad_m (onehot(target_m) -
    softmax(logits_m))`` is built in place from ``exp(logits - lse)``. Autograd's ``log_softmax`` + ``gather`` saves
    the log-softmax and builds the gather's zero-filled gradient and the log-softmax's gradient, one ``[M, V]`` more at
    the step's peak: 156 MB for a 256-token chunk of a 151,936-token vocabulary (issue 42: the fp32 step at
    Qwen2.5-0.5B width, 4 x 512 tokens, peaked 0.16 GB lower with this)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1)  # [M]
        ctx.save_for_backward(logits, lse, targets)
        return logits.gather(-1, targets[:, None]).squeeze(-1) - lse  # [M]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, targets = ctx.saved_tensors
        grad_logits = (logits - lse[:, None]).exp_().mul_(-grad[:, None])  # [M, V]: -grad * softmax
        return grad_logits.scatter_add_(-1, targets[:, None], grad[:, None]), None  # + grad at the target


def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] in fp32.  ``[..., V]``, ``[...]`` -> ``[...]``."""
    flat = logits.float().reshape(-1, logits.shape[-1])  # [M, V]
    return TokenLogSoftmax.apply(flat, token_ids.reshape(-1)).reshape(token_ids.shape)


class TokenLogSoftmaxEntropy(torch.autograd.Function):
    """``[M, 2]``: each row's ``logits[m, target_m] - logsumexp(logits[m])`` and the entropy H of softmax(logits[m]),
    for ``logits [M, V]``, ``targets [M]``, saving only the logits (as ``TokenLogSoftmax``). Its backward builds the
    gradient g_logp (onehot - p) - g_H p (log p + H) in two ``[M, V]`` buffers. Measured at Qwen2.5-0.5B width
    (``benchmarks/speed/entropy_cost.py``, 8 x 512 tokens): the entropy costs 0.15 GB of peak RSS above the log-probs
    alone, where autograd's log-softmax, product and sum cost 0.45 GB. A logit of -inf (an id
    ``restrict_to_allowed`` forbids) has p = 0 and gradient 0.

    Example: logits (0, 0), target 0: (-log 2, log 2); (log 3, 0), target 1: (-log 4, 0.5623)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        lse = torch.logsumexp(logits, dim=-1)  # [M]
        weighted = (logits - lse[:, None]).exp_().mul_(logits).nan_to_num_(nan=0.0)  # [M, V]: p * l, 0 where p = 0
        entropy = lse - weighted.sum(dim=-1)  # [M]
        del weighted
        ctx.save_for_backward(logits, lse, entropy, targets)
        return torch.stack([logits.gather(-1, targets[:, None]).squeeze(-1) - lse, entropy], dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse, entropy, targets = ctx.saved_tensors
        grad_logp, grad_entropy = grad[:, 0], grad[:, 1]
        log_probs = logits - lse[:, None]  # [M, V]
        probs = log_probs.exp()  # [M, V]
        # (log p + H) g_H + g_logp, times -p; p = 0 with log p = -inf gives nan, which is that id's gradient 0
        factor = log_probs.add_(entropy[:, None]).mul_(grad_entropy[:, None]).add_(grad_logp[:, None])
        grad_logits = probs.mul_(factor).nan_to_num_(nan=0.0).neg_()
        return grad_logits.scatter_add_(-1, targets[:, None], grad_logp[:, None]), None


def chunk_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, allowed_ids: torch.Tensor | None,
                   temperature: float, with_entropy: bool = False) -> torch.Tensor:
    """One chunk: log softmax(head(hidden) / T)[target], ``[C, H]``, ``[C]`` -> ``[C]`` fp32; with ``with_entropy``
    ``[C, 2]``: each token's log-prob and the entropy of its distribution."""
    logits = head(hidden).float()  # [C, V]
    if temperature != 1.0:
        logits = logits / temperature
    if allowed_ids is not None:
        logits = restrict_to_allowed(logits, allowed_ids)
    if with_entropy:
        return TokenLogSoftmaxEntropy.apply(logits, targets)  # [C, 2]
    return gather_logprobs(logits, targets)


def head_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                  allowed_ids: torch.Tensor | None = None, chunk_tokens: int = CHUNK_TOKENS,
                  with_entropy: bool = False) -> torch.Tensor:
    """Log-probs ``[M]`` (fp32) of ``targets [M]`` under softmax(head(hidden) / T) for ``hidden [M, H]`` (the state
    before each target), ``chunk_tokens`` tokens at a time; under autograd each chunk is recomputed in backward, so
    only its ``[C, H]`` input is kept. ``allowed_ids [M, C]`` restricts a token's distribution (see
    ``restrict_to_allowed``). ``with_entropy``: ``[M, 2]``, each distribution's entropy beside the log-prob."""
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    pieces = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        part = slice(start, start + chunk_tokens)
        args = (head, hidden[part], targets[part], None if allowed_ids is None else allowed_ids[part], temperature,
                with_entropy)
        pieces.append(checkpoint(chunk_logprobs, *args, use_reentrant=False) if recompute else chunk_logprobs(*args))
    # no target at all (e.g. every completion masked as truncated): an empty result still tied to the graph, so the
    # loss backpropagates zero gradients instead of failing
    if not pieces:
        empty = hidden.float().sum(-1)  # [0]
        return torch.stack([empty, empty], dim=-1) if with_entropy else empty
    return torch.cat(pieces)  # [M] or [M, 2]


def body_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack (ids -> last hidden states) and the output head of a causal LM, a PEFT model or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def last_hidden_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       position_ids: torch.Tensor) -> torch.Tensor:
    """The body's last hidden states ``[N, L, H]`` (no output head); ``attention_mask`` is ``[N, L]`` or a 4-D
    additive mask."""
    body, _ = body_and_head(model)
    return body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=False).last_hidden_state


def logprobs_from_hidden(
    model: Any,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    wanted: torch.Tensor,
    temperature: float = 1.0,
    constraint: FirstTokenConstraint | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    with_entropy: bool = False,
) -> torch.Tensor:
    """``[N, L]`` log-probs of the ``wanted [N, L]`` tokens of ``input_ids [N, L]`` from the body's hidden states
    ``[N, L, H]`` (position t-1 predicts token t), 0 everywhere else and in column 0 (no context); ``[N, L, 2]``
    with ``with_entropy`` (log-prob, entropy)."""
    wanted = wanted.bool().clone()
    wanted[:, 0] = False
    rows, cols = wanted.nonzero(as_tuple=True)  # [M], [M]
    allowed = None if constraint is None else constraint.at(rows, cols)  # [M, C]
    _, head = body_and_head(model)
    picked = head_logprobs(head, hidden[rows, cols - 1], input_ids[rows, cols], temperature, allowed, chunk_tokens,
                           with_entropy)  # [M] or [M, 2]
    shape = (*wanted.shape, *picked.shape[1:])
    return torch.zeros(shape, dtype=picked.dtype, device=hidden.device).index_put((rows, cols), picked)


def wanted_tokens(attention_mask: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
    """The tokens whose log-prob a forward computes ``[N, L]``: ``token_mask`` on real tokens, or every real one."""
    return attention_mask.bool() if token_mask is None else token_mask.bool() & attention_mask.bool()


def align_hidden(hidden: torch.Tensor) -> torch.Tensor:
    """``[N, L, H]`` shifted so that ``[:, t]`` is the state that predicts token t (0 in column 0)."""
    return torch.cat([hidden.new_zeros(hidden.shape[0], 1, hidden.shape[2]), hidden[:, :-1]], dim=1)


def logprobs_and_hidden(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    constraint: FirstTokenConstraint | None = None,
    token_mask: torch.Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One padded forward: log-probs ``[N, L]`` (as ``sequence_logprobs``, ``[N, L, 2]`` with the entropies) and
    the last hidden states aligned with the tokens (``align_hidden``: ``[:, t]`` predicts token t), on which the
    value and risk heads sit."""
    hidden = last_hidden_states(model, input_ids, attention_mask.long(), padded_positions(attention_mask))
    wanted = wanted_tokens(attention_mask, token_mask)
    logp = logprobs_from_hidden(model, hidden, input_ids, wanted, temperature, constraint, chunk_tokens, with_entropy)
    return logp, align_hidden(hidden)


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    constraint: FirstTokenConstraint | None = None,
    token_mask: torch.Tensor | None = None,
    chunk_tokens: int = CHUNK_TOKENS,
    with_entropy: bool = False,
) -> torch.Tensor:
    """Log-prob of each token given the tokens before it, from ``logits / temperature``.

    Args:
        model: a causal LM (or a PEFT model around one).
        input_ids: ``[N, L]`` right-padded prompt + completion rows.
        attention_mask: ``[N, L]`` 1 on real tokens.
        temperature: the sampler's temperature, so the trainer scores the distribution that was sampled.
        constraint: the sampler's first-token constraints, if any were applied.
        token_mask: ``[N, L]`` the tokens whose log-prob is wanted (e.g. ``completion_mask``); None: every real one.
        chunk_tokens: tokens per output-head chunk.
        with_entropy: also each token's distribution's entropy.

    Returns:
        ``[N, L]`` fp32 (``[N, L, 2]`` with the entropies); 0 in column 0 (no context), on padding and on tokens
        outside ``token_mask``.
    """
    hidden = last_hidden_states(model, input_ids, attention_mask.long(), padded_positions(attention_mask))
    wanted = wanted_tokens(attention_mask, token_mask)
    return logprobs_from_hidden(model, hidden, input_ids, wanted, temperature, constraint, chunk_tokens, with_entropy)


def token_hidden_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last hidden states of right-padded rows aligned with the tokens (``[N, L, H]``, ``[:, t]`` predicts
    token t, 0 in column 0), without any output head: what the value and risk heads read."""
    return align_hidden(last_hidden_states(model, input_ids, attention_mask.long(), padded_positions(attention_mask)))


def head_problem(model: Any) -> str | None:
    """Why the model's logits are not ``head(body(ids))`` (e.g. a final soft-cap or logit scale in its forward,
    which the chunked head would skip), or None; checked on a short probe in eval mode."""
    vocab = int(model.config.vocab_size)
    ids = torch.tensor([[1 % vocab, 2 % vocab, 3 % vocab]], device=model.get_input_embeddings().weight.device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            expected = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0, :-1]  # [2, V]
            expected = expected.gather(-1, ids[0, 1:, None]).squeeze(-1)
            got = sequence_logprobs(model, ids, torch.ones_like(ids))[0, 1:]
    finally:
        model.train(was_training)
    error = float((expected - got).abs().max())
    if error <= 1e-3:
        return None
    return (f"{type(model).__name__}'s logits are not its output head applied to its last hidden states (probe "
            f"log-probs differ by {error:.3g}); lit-grpo computes log-probs from the head in chunks and cannot train "
            "this architecture")


@torch.no_grad()
def chunked_eval(model: Any, num_rows: int, batch_size: int, forward: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """``forward(rows)`` over consecutive slices of ``batch_size`` of ``num_rows`` rows, concatenated on dim 0: the
    no-grad passes (pi_old, pi_ref, values, risk) run in eval mode because the sampler ran without dropout, in
    chunks so that memory stays bounded; the model's training flag is restored even if a chunk fails."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([forward(slice(i, i + batch_size)) for i in range(0, num_rows, batch_size)], dim=0)
    finally:
        model.train(was_training)


def rows_per_pass(batch_tokens: int, width: int) -> int:
    """Rows of ``width`` tokens in one no-grad forward of at most ``batch_tokens`` tokens (at least one)."""
    return max(1, batch_tokens // max(1, width))


def sampler_agreement(
    logp: torch.Tensor, sampler_logp: torch.Tensor, completion_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """max and mean |sampler - trainer| log-prob over counted tokens: ~0 in fp32 when the engine is in sync."""
    diff = (sampler_logp - logp).abs()[completion_mask]
    if diff.numel() == 0:
        return {}
    return {"logp_diff_max": diff.max(), "logp_diff_mean": diff.mean()}
