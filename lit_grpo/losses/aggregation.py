"""Reducing per-token values over the counted tokens of a batch (docs/guide.md#the-math).

The three modes weigh tokens differently, and that choice is a length bias:

- ``seq-mean`` (original GRPO): every sequence weighs the same, so a token of a short completion weighs more than a
  token of a long one; a wrong long answer is penalised less per token than a wrong short one.
- ``token-mean`` (DAPO): every counted token weighs the same, so long sequences dominate the batch.
- ``seq-sum`` (LUSPO): each sequence's sum over its tokens, averaged over sequences, so a sequence weighs by its
  length (GSPO's per-sequence mean times the length: the length bias of ``seq-mean`` undone).
- ``constant`` (Dr. GRPO): the sum divided by ``num_sequences * max_new_tokens``, a constant that does not depend
  on the lengths sampled, so no length is favoured by the normaliser itself.

Each mode is a numerator over a denominator (``aggregation_terms``). To keep a loss independent of how an optimizer
step is split (minibatches accumulated into it, DDP ranks), add the denominators over the whole step and divide
each part's numerator by that total.

A sequence is one row, unless ``Sequences`` says otherwise: a tool task's chain lays out each assistant turn as its
own row, where TRL's sequence is the whole multi-turn completion (its tool tokens masked out). There each row carries
its episode's counted tokens and its episode's number of rows, and an episode weighs as one sequence: a row counts
``1 / rows`` of a sequence, so the denominators still add up over any split of the step into minibatches and ranks.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import torch

from lit_grpo.losses.advantages import check_choice

Aggregation = Literal["seq-mean", "token-mean", "constant", "seq-sum"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


class Sequences(NamedTuple):
    """Per row, the sequence (episode) it is part of, where a sequence spans several rows (a tool task's chain).

    ``tokens [N]``: the episode's counted tokens over all its rows; ``rows [N]``: the number of rows of its episode
    (>= 1); ``ids [N]``: the episode's number (any integers, equal on the rows of one episode). Rows of one episode
    carry equal values, and a minibatch holds every row of each of its episodes (whole groups: the buffer's
    ``minibatch_plan``). Example: a 3-turn episode of 2 + 3 + 1 counted tokens and a 1-turn one of 4: tokens
    [6, 6, 6, 4], rows [3, 3, 3, 1], ids [0, 0, 0, 1].
    """

    tokens: torch.Tensor  # [N]
    rows: torch.Tensor  # [N]
    ids: torch.Tensor  # [N] long


def check_aggregation(mode: str, max_new_tokens: int | None) -> None:
    """Validate an aggregation mode and, for ``constant``, its required ``max_new_tokens``."""
    check_choice("aggregation", mode, AGGREGATIONS)
    if mode == "constant" and (max_new_tokens is None or max_new_tokens <= 0):
        raise ValueError("aggregation 'constant' needs max_new_tokens (a positive int), got " f"{max_new_tokens!r}")


def aggregation_terms(
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    mode: str = "seq-mean",
    max_new_tokens: int | None = None,
    sequences: Sequences | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator of ``masked_aggregate``: ``(sum part [], count part [])``; ``values`` and
    ``completion_mask`` ``[N, T]``.

    ``seq-mean``: (sum over rows of row_sum / max(row_count, 1), number of rows); ``token-mean``: (sum of counted
    values, number of counted tokens); ``constant``: (sum of counted values, rows * max_new_tokens); ``seq-sum``:
    (sum of counted values, number of rows).

    With ``sequences`` (``[N]`` each), a sequence is an episode of several rows, as TRL's multi-turn completion:
    ``seq-mean`` divides each row's sum by its episode's counted tokens (max 1) and every count of rows becomes
    the number of episodes, sum over rows of 1 / rows (the episode's share on each of its rows); ``token-mean``
    is unchanged. Example: a 3-row episode (tokens 6) and a 1-row one (tokens 4) under ``seq-mean``: (sum of the
    first three rows' counted values / 6 + the last row's / 4, 1/3 + 1/3 + 1/3 + 1 = 2).
    """
    check_aggregation(mode, max_new_tokens)
    if values.shape != completion_mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and completion_mask {tuple(completion_mask.shape)} differ")
    if sequences is None:
        num_sequences = values.new_tensor(float(values.shape[0]))
    else:
        check_sequences(sequences, values.shape[0])
        num_sequences = (1.0 / sequences.rows.to(values.dtype)).sum()
    if mode == "seq-mean":
        if sequences is None:
            return sequence_mean(values, completion_mask).sum(), num_sequences
        mask = completion_mask.to(values.dtype)  # [N, T]
        return ((values * mask).sum(dim=-1) / sequences.tokens.to(values.dtype).clamp(min=1)).sum(), num_sequences
    mask = completion_mask.to(values.dtype)  # [N, T]
    counted_sum = (values * mask).sum()
    if mode == "token-mean":
        return counted_sum, mask.sum()
    if mode == "seq-sum":
        return counted_sum, num_sequences
    return counted_sum, num_sequences * max_new_tokens


def check_sequences(sequences: Sequences, num_rows: int) -> None:
    """Raise ``ValueError`` unless ``sequences``' tensors are ``[num_rows]`` (shapes only: reading values would wait
    for the device on every minibatch; ``rows`` >= 1 is the buffer's to keep)."""
    shapes = {name: tuple(getattr(sequences, name).shape) for name in Sequences._fields}
    if any(shape != (num_rows,) for shape in shapes.values()):
        raise ValueError(f"sequences' {', '.join(f'{name} {shape}' for name, shape in shapes.items())} must be "
                         f"[{num_rows}], one per row")


def sequence_totals(row_values: torch.Tensor, sequences: Sequences | None) -> torch.Tensor:
    """Each row's value summed over the rows of its sequence, ``[N]`` -> ``[N]`` (differentiable): the row's own
    value where each row is a sequence (``sequences`` None). Example: values [1, 2, 4, 8], ids [0, 0, 0, 5]:
    [7, 7, 7, 8]."""
    if sequences is None or row_values.shape[0] == 0:
        return row_values
    episode = torch.unique(sequences.ids, return_inverse=True)[1]  # [N] in 0..episodes-1
    totals = row_values.new_zeros(int(episode.max()) + 1).index_add(0, episode, row_values)  # [episodes]
    return totals[episode]


def sequence_log_mean(log_values: torch.Tensor, completion_mask: torch.Tensor,
                      sequences: Sequences | None) -> torch.Tensor:
    """The mean of ``log_values [N, T]`` over the counted tokens of each row's sequence (all the rows of its episode
    where ``sequences`` says a sequence spans several), ``[N]``; 0 for a sequence with no counted token."""
    mask = completion_mask.to(log_values.dtype)  # [N, T]
    sums = sequence_totals((log_values * mask).sum(dim=-1), sequences)  # [N]
    return sums / sequence_totals(mask.sum(dim=-1), sequences).clamp(min=1)


def per_sequence_mean(row_values: torch.Tensor, sequences: Sequences | None) -> torch.Tensor:
    """The mean over sequences of a value each sequence has once (equal on the rows of a multi-row episode), every
    sequence counting, as TRL averages its sequence-level figures: ``[N]`` -> ``[]``, 0 with no row."""
    if row_values.shape[0] == 0:
        return row_values.new_zeros(())
    if sequences is None:
        return row_values.mean()
    share = 1.0 / sequences.rows.to(row_values.dtype)  # [N] each row's share of its episode
    return (row_values * share).sum() / share.sum()


def sequence_mean(values: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean over counted tokens; 0 for a row with none.  ``[N, T]`` -> ``[N]``."""
    mask = completion_mask.to(values.dtype)  # [N, T]
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


def masked_aggregate(
    values: torch.Tensor,
    completion_mask: torch.Tensor,
    mode: str = "seq-mean",
    max_new_tokens: int | None = None,
    sequences: Sequences | None = None,
) -> torch.Tensor:
    """Reduce ``[N, T]`` per-token values to a scalar over the tokens where ``completion_mask`` is True.

    Args:
        values: ``[N, T]`` per-token values (a surrogate, a KL estimate, ...).
        completion_mask: ``[N, T]`` bool, True where the token counts.
        mode: ``seq-mean``, ``token-mean``, ``constant`` or ``seq-sum`` (the module docstring: their length
            biases).
        max_new_tokens: the generation budget; required by ``constant``.
        sequences: a sequence's span over rows when one spans several (``Sequences``); None: each row is one.

    Returns:
        A scalar. A row with no counted token contributes 0 and still counts as a sequence; a batch with no counted
        token gives 0.

    Example: values [[1, 2], [3, 4]], mask [[1, 1], [0, 0]]: ``seq-mean`` (1.5 + 0) / 2 = 0.75, ``token-mean``
    3 / 2 = 1.5, ``constant`` with max_new_tokens 4: 3 / (2 * 4) = 0.375, ``seq-sum`` 3 / 2 = 1.5 (with mask
    [[1, 1], [1, 0]]: token-mean 6 / 3 = 2, seq-sum 6 / 2 = 3).
    """
    numerator, denominator = aggregation_terms(values, completion_mask, mode, max_new_tokens, sequences)
    return divide_by_count(numerator, denominator)


def divide_by_count(numerator: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """``numerator / count``; 0 when the count is 0 (its numerator is then 0 too). A count may be a fraction (a part
    of an episode's rows, ``Sequences``): it is never clamped up to 1, so a part's ``numerator / count`` times its
    share ``count / step total`` is its ``numerator / step total`` exactly."""
    return numerator / torch.where(count > 0, count, torch.ones_like(count))


def masked_mean(values: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the counted tokens, 0 when none counts.  ``[N, T]`` -> ``[]``."""
    return masked_aggregate(values, completion_mask, mode="token-mean")
