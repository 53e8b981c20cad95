"""Shared-prefix training forward (docs/guide.md#your-own-model): every shared prefix computed once, with exact
gradients.

Rows that share a context (a prompt's G completions, or a tree's nodes, each with its ancestors as context) are
merged into a token trie and laid out depth-first in one packed row. Each packed token gets the position id of its
place in its own branch and a 4-D additive attention mask in which it sees only itself and its ancestors, so its
hidden state is the one a separate forward of any row through it would compute. The log-prob of a row's token t
is read at the packed slot of token t-1, so shared tokens are computed once and their gradients sum over the rows
that use them. The result has the padded forward's layout, ``[N, L]``, so the losses are unchanged.

With ``lora.dropout`` > 0 a shared token draws one dropout mask for all the rows through it (each row still sees
an ordinary dropout sample). The mask is float (0 allowed, the dtype's minimum elsewhere): transformers' eager attention adds the mask to the
scores, so a boolean 4-D mask there silently gives wrong logits (docs/guide.md#your-own-model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_grpo.policy.logprobs import (
    CHUNK_TOKENS,
    FirstTokenConstraint,
    body_and_head,
    chunked_eval,
    head_logprobs,
    last_hidden_states,
    rows_per_pass,
    sequence_logprobs,
)

MASK_ATTENTION = ("eager", "sdpa")  # transformers' kernels that take a custom 4-D float mask as given
MAX_PACK_TOKENS = 1024  # dense attention over a pack is quadratic in its length: cap it, repeat the prefix instead


@dataclass
class PackLayout:
    """Where every token of ``N`` right-padded rows sits in ``P`` packed rows of width ``W``.

    ``parent`` is the slot of each slot's predecessor in its branch (itself where there is none: pack roots and
    padding, flagged False in ``has_parent``); ``row_slots[r, t]`` is the slot of row r's token t in pack
    ``row_pack[r]`` (0 past the row's end).
    """

    input_ids: torch.Tensor  # [P, W]
    position_ids: torch.Tensor  # [P, W]
    parent: torch.Tensor  # [P, W]
    has_parent: torch.Tensor  # [P, W] bool
    ancestors: torch.Tensor  # [P, W, W] bool: key j is query i or one of its ancestors
    row_pack: torch.Tensor  # [N]
    row_slots: torch.Tensor  # [N, L]

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive 4-D mask ``[P, 1, W, W]``: 0 where a query sees a key, the dtype's minimum elsewhere."""
        blocked = torch.full(self.ancestors.shape, torch.finfo(dtype).min, dtype=dtype)
        return blocked.masked_fill(self.ancestors, 0.0).unsqueeze(1)


def context_lengths(attention_mask: torch.Tensor, completion_mask: torch.Tensor) -> list[int]:
    """Tokens before each row's first counted token (its whole length if it has none).  ``[N, L]`` -> ``N`` ints."""
    lengths = attention_mask.sum(dim=1)  # [N]
    first = torch.where(completion_mask.any(dim=1), completion_mask.int().argmax(dim=1), lengths)  # [N]
    return first.tolist()


def assign_packs(rows: list[list[int]], contexts: list[int], max_pack_tokens: int) -> list[list[int]]:
    """Consecutive rows that share the first row's context go in one pack, as long as its trie stays within
    ``max_pack_tokens`` (a row longer than that gets a pack of its own).  -> row indices per pack."""
    packs: list[list[int]] = []
    trie: dict[tuple[int, int], int] = {}  # (parent slot, token) -> slot of the current pack; parent -1 at the root
    size = 0
    for index, row in enumerate(rows):
        joins = bool(packs)
        if joins:
            first = rows[packs[-1][0]]
            shared = contexts[packs[-1][0]]
            joins = len(row) >= shared and row[:shared] == first[:shared]
        new_tokens = len(row) - shared_prefix_length(trie, row) if joins else len(row)
        if not joins or size + new_tokens > max_pack_tokens:
            packs.append([])
            trie, size = {}, 0
        size += insert_row(trie, row, size)
        packs[-1].append(index)
    return packs


def shared_prefix_length(trie: dict[tuple[int, int], int], row: list[int]) -> int:
    """How many leading tokens of ``row`` the trie already holds."""
    slot, depth = -1, 0
    for token in row:
        slot = trie.get((slot, token), -2)
        if slot == -2:
            break
        depth += 1
    return depth


def insert_row(trie: dict[tuple[int, int], int], row: list[int], size: int) -> int:
    """Add ``row``'s missing tokens to the trie as slots ``size, size + 1, ...``; -> how many were added."""
    slot, added = -1, 0
    for token in row:
        child = trie.get((slot, token))
        if child is None:
            child = trie[(slot, token)] = size + added
            added += 1
        slot = child
    return added


def build_layout(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    max_pack_tokens: int = MAX_PACK_TOKENS,
) -> PackLayout:
    """The packed layout of right-padded rows ``[N, L]`` (groups or tree nodes contiguous, as the buffer keeps them)."""
    lengths = attention_mask.sum(dim=1).tolist()
    rows = [ids[:length] for ids, length in zip(input_ids.tolist(), lengths)]
    packs = assign_packs(rows, context_lengths(attention_mask, completion_mask), max_pack_tokens)
    row_pack = [0] * len(rows)
    row_slots = [[0] * input_ids.shape[1] for _ in rows]
    tokens: list[list[int]] = []
    parents: list[list[int]] = []
    for pack_index, members in enumerate(packs):
        trie: dict[tuple[int, int], int] = {}
        pack_tokens: list[int] = []
        pack_parents: list[int] = []
        for row_index in members:
            slot = -1
            for t, token in enumerate(rows[row_index]):
                child = trie.get((slot, token))
                if child is None:
                    child = trie[(slot, token)] = len(pack_tokens)
                    pack_tokens.append(token)
                    pack_parents.append(slot)
                row_slots[row_index][t] = child
                slot = child
            row_pack[row_index] = pack_index
        tokens.append(pack_tokens)
        parents.append(pack_parents)
    return layout_tensors(tokens, parents, torch.tensor(row_pack), torch.tensor(row_slots, dtype=torch.long))


def layout_tensors(
    tokens: list[list[int]], parents: list[list[int]], row_pack: torch.Tensor, row_slots: torch.Tensor
) -> PackLayout:
    """Pad the packs to one width and derive the ancestor relation and positions from the parent links."""
    width = max(len(t) for t in tokens)
    num_packs = len(tokens)
    input_ids = torch.zeros((num_packs, width), dtype=torch.long)
    parent = torch.arange(width).repeat(num_packs, 1)  # [P, W]: padding is its own parent
    for p, (pack_tokens, pack_parents) in enumerate(zip(tokens, parents)):
        input_ids[p, : len(pack_tokens)] = torch.tensor(pack_tokens)
        links = torch.tensor(pack_parents)  # [W_p], -1 at the roots
        parent[p, : len(pack_parents)] = torch.where(links >= 0, links, torch.arange(len(pack_parents)))
    has_parent = parent != torch.arange(width)  # [P, W]
    ancestors = torch.eye(width, dtype=torch.bool).repeat(num_packs, 1, 1)  # [P, W, W]
    pack = torch.arange(num_packs)[:, None]  # [P, 1]
    query = torch.arange(width)[None, :]  # [1, W]
    above = parent.clone()  # [P, W]: walk up one generation per step, marking each ancestor
    while True:
        newly = ~ancestors[pack, query, above]  # [P, W]: False once a slot's walk has stopped at its root
        if not newly.any():
            break
        ancestors[pack, query, above] = True
        above = parent.gather(1, above)
    position_ids = ancestors.sum(dim=-1) - 1  # [P, W]: depth in the branch, as in a row of its own
    return PackLayout(input_ids, position_ids, parent, has_parent, ancestors, row_pack, row_slots)


def packed_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    max_pack_tokens: int = MAX_PACK_TOKENS,
    chunk_tokens: int = CHUNK_TOKENS,
    with_entropy: bool = False,
) -> torch.Tensor:
    """``sequence_logprobs`` of the counted tokens computed with every shared prefix once: same ``[N, L]`` layout
    (``[N, L, 2]`` with the entropies), 0 on every token that ``completion_mask`` does not count (column 0, context
    and padding included).

    Args:
        model: a causal LM whose attention takes a custom 4-D float mask (eager or sdpa in transformers).
        input_ids: ``[N, L]`` right-padded rows; rows sharing a context are contiguous.
        attention_mask: ``[N, L]`` True on real tokens.
        completion_mask: ``[N, L]`` True on counted tokens; what precedes a row's first one is its context.
        temperature: the sampler's temperature.
        max_pack_tokens: the longest packed row.
        chunk_tokens: tokens per output-head chunk.
    """
    layout = build_layout(input_ids.cpu(), attention_mask.cpu(), completion_mask.cpu(), max_pack_tokens)
    device = input_ids.device
    dtype = model.get_input_embeddings().weight.dtype
    hidden = last_hidden_states(
        model, layout.input_ids.to(device), layout.attention_bias(dtype).to(device), layout.position_ids.to(device)
    )  # [P, W, H]
    counted = completion_mask.bool() & attention_mask.bool()  # [N, L]
    counted[:, 0] = False
    row_pack = layout.row_pack.to(device)[:, None].expand_as(counted)  # [N, L]
    row_slots = layout.row_slots.to(device)
    needed = torch.zeros(layout.input_ids.shape, dtype=torch.bool, device=device)  # [P, W]
    needed[row_pack[counted], row_slots[counted]] = True  # a slot shared by several rows is computed once
    packs, slots = needed.nonzero(as_tuple=True)  # [M], [M]
    parents = layout.parent.to(device)[packs, slots]  # [M]: the slot whose state predicts each needed token
    _, head = body_and_head(model)
    picked = head_logprobs(head, hidden[packs, parents], layout.input_ids.to(device)[packs, slots], temperature,
                           chunk_tokens=chunk_tokens, with_entropy=with_entropy)  # [M] or [M, 2]
    slot_logp = torch.zeros((*needed.shape, *picked.shape[1:]), dtype=picked.dtype, device=device)
    slot_logp = slot_logp.index_put((packs, slots), picked)
    counted = counted[..., None] if with_entropy else counted
    return slot_logp[row_pack, row_slots] * counted  # [N, L] or [N, L, 2]


def packing_problem(model: Any) -> str | None:
    """Why the packed forward cannot stand in for the padded one on ``model``, or None.

    The attention kernel must take a custom 4-D float mask, and a probe (two rows sharing a prefix) must give the
    padded forward's log-probs, which catches models that rebuild or ignore the mask they are given.
    """
    kernel = getattr(model.config, "_attn_implementation", None)
    if kernel not in MASK_ATTENTION:
        return f"attention kernel {kernel!r} does not take a custom 4-D mask (supported: {', '.join(MASK_ATTENTION)})"
    vocab = int(model.config.vocab_size)
    rows = [[1 % vocab, 5 % vocab, 6 % vocab, 7 % vocab], [1 % vocab, 5 % vocab, 6 % vocab, 8 % vocab, 9 % vocab]]
    input_ids = torch.tensor([rows[0] + [0], rows[1]])  # [2, 5]
    attention_mask = torch.tensor([[True] * 4 + [False], [True] * 5])
    completion_mask = torch.tensor([[False] * 3 + [True, False], [False] * 3 + [True] * 2])
    device = model.get_input_embeddings().weight.device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            args = (input_ids.to(device), attention_mask.to(device))
            padded = sequence_logprobs(model, *args, token_mask=completion_mask.to(device))
            packed = packed_logprobs(model, *args, completion_mask.to(device))
    finally:
        model.train(was_training)
    error = float((padded - packed).abs().max())
    # another summation order moves a half-precision base by a few ulps; a broken mask moves it by whole nats
    tolerance = max(1e-4, 8 * torch.finfo(model.get_input_embeddings().weight.dtype).eps)
    return None if error <= tolerance else f"a probe's packed log-probs differ from the padded forward's by {error:.3g}"


class TokenLogprobs:
    """The trainer's per-token log-probs of the counted tokens: the shared-prefix (packed) forward where the model
    allows it, else the padded one, chosen once per policy (with an info message when packing was asked for and is
    not possible).

    Args:
        model: the policy (a PEFT model or a plain causal LM).
        packed: use the shared-prefix forward if the model supports it.
        chunk_tokens: tokens per output-head chunk.
    """

    def __init__(self, model: Any, packed: bool, chunk_tokens: int = CHUNK_TOKENS) -> None:
        problem = packing_problem(model) if packed else None
        if problem is not None:
            rank_zero_info(f"memory.packed_forward: using the padded forward instead: {problem}")
        self.packed = packed and problem is None
        self.chunk_tokens = chunk_tokens

    def __call__(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 completion_mask: torch.Tensor, temperature: float,
                 constraint: FirstTokenConstraint | None = None, with_entropy: bool = False) -> torch.Tensor:
        """``[N, L]`` log-probs of the counted tokens, 0 elsewhere, with gradients (the training forward; ``[N, L,
        2]`` with each token's entropy). Rows with a first-token restriction (the risk rule's forced defers) take the
        padded forward, which renormalises over the allowed ids."""
        if self.packed and constraint is None:
            return packed_logprobs(model, input_ids, attention_mask, completion_mask, temperature,
                                   chunk_tokens=self.chunk_tokens, with_entropy=with_entropy)
        return sequence_logprobs(model, input_ids, attention_mask, temperature, constraint, completion_mask,
                                 self.chunk_tokens, with_entropy)

    def batched(self, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                completion_mask: torch.Tensor, temperature: float, batch_tokens: int,
                constraint: FirstTokenConstraint | None = None) -> torch.Tensor:
        """``[N, L]`` log-probs in forwards of at most ``batch_tokens`` padded tokens, in eval mode, without
        gradients (pi_old, pi_ref)."""

        def forward(rows: slice) -> torch.Tensor:
            restriction = None if constraint is None else constraint.rows(rows.start, rows.stop)
            return self(model, input_ids[rows], attention_mask[rows], completion_mask[rows], temperature, restriction)

        return chunked_eval(model, input_ids.shape[0], rows_per_pass(batch_tokens, input_ids.shape[1]), forward)
