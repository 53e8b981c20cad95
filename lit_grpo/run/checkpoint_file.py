"""What a checkpoint file holds: the checkpoint with its tensors packed into one byte buffer.

``torch.save`` pickles each tensor through ~30 us of Python (its reduction, and ~20 objects through the persistent-id
hook). The quickstart's checkpoint holds 228 small tensors (the adapter, and Adam's two moments and step for each of
its weights): pickling them one by one held the GIL ~8 ms of every save, on the background writer as much as on the
training thread, and was most of what a checkpoint cost a one-step epoch (issue 34). ``pack`` copies each storage
once into one uint8 buffer and puts a marker string where each tensor was; ``unpack`` rebuilds the tensors.

A packed file (version 1) is a dict that ``torch.load(weights_only=True)`` reads:

- ``"lit_grpo_packed_checkpoint"``: 1
- ``"tree"``: the checkpoint, each packed tensor replaced by the string ``MARK + "<i>"``
- ``"storage_bytes"``: int64 ``[S]``, each storage's length in bytes; the storages lie back to back in ``"data"``
- ``"tensors"``: int64 ``[N, 4 + 2 * D]``, tensor i's row: its storage, dtype (index into ``DTYPES``), storage
  offset in elements, number of dimensions d, then d sizes and d strides (zero-padded to the widest tensor's D)
- ``"data"``: uint8 ``[sum(storage_bytes)]``

Packed views and tensors sharing a storage share it again once unpacked, as ``torch.load`` keeps them. A tensor
that is not a plain dense CPU tensor (a ``Parameter``, one that requires grad, on another device, quantized, of a
dtype outside ``DTYPES``, expanded by a zero stride) stays in the tree as a tensor, copied (``tensor_snapshot``),
and is pickled as ``torch.save`` pickles it. Such a tensor and a packed one sharing a storage no longer share it once
unpacked (none does in the checkpoints Lightning builds here).

``load_checkpoint`` reads a packed file and one written before packing (returned as it was saved), or only what a
packed one holds (``shapes_only``: meta tensors, no byte of data read), as the resume check does.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from pathlib import Path
from typing import Any

import torch

FORMAT_KEY = "lit_grpo_packed_checkpoint"
VERSION = 1
MARK = "\x00lit-grpo tensor "
MARKED = re.compile(re.escape(MARK) + r"(\d+)")
# the code of a dtype is its index here: append only, never reorder (written files name dtypes by these codes)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)
DTYPE_CODES = {dtype: code for code, dtype in enumerate(DTYPES)}


def rebuild(value: Any, leaf: Any) -> Any:
    """``value`` with its dicts (their type and attributes, as a state dict's ``_metadata``), lists and tuples rebuilt
    and every other item ``x`` replaced by ``leaf(x)``."""
    if isinstance(value, dict):
        copied = copy.copy(value)  # its type, a default factory, attributes
        for key, item in value.items():
            copied[key] = rebuild(item, leaf)
        if getattr(value, "__dict__", None):
            vars(copied).update(copy.deepcopy(vars(value)))
        return copied
    if type(value) is list:
        return [rebuild(item, leaf) for item in value]
    if type(value) is tuple:
        return tuple(rebuild(item, leaf) for item in value)
    return leaf(value)


def plain_copy(item: Any) -> Any:
    """``item`` itself if immutable (None, a number, a string), else a deep copy."""
    if item is None or isinstance(item, (bool, int, float, complex, str, bytes)):
        return item
    return copy.deepcopy(item)


def tensor_snapshot(tensor: torch.Tensor, storages: dict[int, torch.UntypedStorage]) -> torch.Tensor:
    """``tensor`` over a copy of its storage (copied on first sight, keyed as ``torch.save`` keys storages)."""
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_conj() or tensor.is_neg():
        return tensor.detach().clone()  # no storage of their own to share: copied alone
    storage = tensor.untyped_storage()
    if storage._cdata not in storages:
        storages[storage._cdata] = storage.clone()
    copied = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    copied.set_(storages[storage._cdata], tensor.storage_offset(), tensor.size(), tensor.stride())
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(copied, requires_grad=tensor.requires_grad)
    return copied


def packable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a plain dense CPU tensor of a dtype ``DTYPES`` names (the module docstring), with no
    more elements than its storage holds (``unpack`` refuses a zero-stride expansion: in a hostile file it would
    make a few bytes into any number of elements)."""
    return (type(tensor) is torch.Tensor and tensor.is_cpu and tensor.layout == torch.strided
            and not tensor.requires_grad and tensor.dtype in DTYPE_CODES and not tensor.is_quantized
            and not tensor.is_conj() and not tensor.is_neg() and not getattr(tensor, "__dict__", None)
            and tensor.numel() * tensor.element_size() <= tensor.untyped_storage().nbytes())


def pack(checkpoint: Any, out: torch.Tensor | None = None) -> dict[str, Any]:
    """``checkpoint`` as a packed file's dict (module docstring): its tensors' bytes copied now, so the result
    holds the state at this moment whatever is updated in place afterwards. ``out``: a uint8 buffer to copy them
    into if it has the right size (the last pack's ``"data"``, once written), else a new one is allocated."""
    storage_index: dict[int, int] = {}
    storages: list[torch.Tensor] = []  # each a uint8 view of a whole storage  # [bytes]
    rows: list[tuple[int, ...]] = []
    copies: dict[int, torch.UntypedStorage] = {}

    def leaf(item: Any) -> Any:
        if not isinstance(item, torch.Tensor):
            if isinstance(item, str) and item.startswith(MARK):  # would come back as a tensor
                raise ValueError(f"cannot pack a checkpoint holding the string {item!r}: it begins with the marker "
                                 "of a packed tensor")
            return plain_copy(item)
        if not packable(item):
            return tensor_snapshot(item, copies)
        storage = item.untyped_storage()
        index = storage_index.get(storage._cdata)
        if index is None:
            index = storage_index[storage._cdata] = len(storages)
            storages.append(torch.empty(0, dtype=torch.uint8).set_(storage))
        rows.append((index, DTYPE_CODES[item.dtype], item.storage_offset(), item.dim(), *item.shape, *item.stride()))
        return f"{MARK}{len(rows) - 1}"

    tree = rebuild(checkpoint, leaf)
    width = max((len(row) for row in rows), default=4)
    total = sum(s.numel() for s in storages)
    data = out if out is not None and out.dtype == torch.uint8 and out.shape == (total,) else (
        torch.empty(total, dtype=torch.uint8))  # [bytes]
    if storages:
        torch.cat(storages, out=data)  # the copy
    return {
        FORMAT_KEY: VERSION,
        "tree": tree,
        "storage_bytes": torch.tensor([s.numel() for s in storages], dtype=torch.int64),
        "tensors": torch.tensor([row + (0,) * (width - len(row)) for row in rows], dtype=torch.int64).view(-1, width),
        "data": data,
    }


def is_packed(loaded: Any) -> bool:
    return isinstance(loaded, dict) and FORMAT_KEY in loaded


def unpack(loaded: Any, shapes_only: bool = False) -> Any:
    """The checkpoint a packed file's dict holds (each storage copied out of ``"data"``, on its device); anything
    else as it is. ``shapes_only``: the tensors on the meta device (dtype, shape and strides; no byte is read or
    copied), for a check of what a checkpoint holds. A packed dict that does not add up raises ``ValueError`` saying
    what is wrong, before anything is allocated for it."""
    if not is_packed(loaded):
        return loaded
    if type(loaded[FORMAT_KEY]) is not int or loaded[FORMAT_KEY] != VERSION:
        raise ValueError(f"packed checkpoint version {loaded[FORMAT_KEY]!r}; this lit-grpo reads version {VERSION}")
    data, lengths, rows = (loaded.get(key) for key in ("data", "storage_bytes", "tensors"))
    if not (plain_tensor(data, torch.uint8, 1) and plain_tensor(lengths, torch.int64, 1)
            and plain_tensor(rows, torch.int64, 2) and rows.shape[1] >= 4 and "tree" in loaded):
        raise ValueError("packed checkpoint without its data, storage_bytes, tensors or tree (each a contiguous "
                         "tensor of its dtype and rank)")
    bytes_each = lengths.tolist()
    if min(bytes_each, default=0) < 0 or sum(bytes_each) != data.numel():
        raise ValueError(f"packed checkpoint whose storages ({sum(bytes_each)} bytes) do not fill its data "
                         f"({data.numel()} bytes)")
    starts = [0, *itertools.accumulate(bytes_each)][:-1]
    storages = None if shapes_only else [data[start:start + n].clone().untyped_storage()
                                         for start, n in zip(starts, bytes_each)]
    tensors = [tensor_from_row(i, row, bytes_each, storages) for i, row in enumerate(rows.tolist())]

    def leaf(item: Any) -> Any:
        found = MARKED.fullmatch(item) if isinstance(item, str) else None
        if found is None:
            return item
        if int(found[1]) >= len(tensors):
            raise ValueError(f"packed checkpoint names tensor {found[1]} of {len(tensors)}")
        return tensors[int(found[1])]

    return rebuild(loaded["tree"], leaf)


def plain_tensor(value: Any, dtype: torch.dtype, dims: int) -> bool:
    """Whether ``value`` is a contiguous tensor of ``dtype`` and rank ``dims`` (a tensor expanded by zero strides
    would make a few bytes of file into any number of elements)."""
    return (isinstance(value, torch.Tensor) and value.dtype == dtype and value.dim() == dims
            and value.is_contiguous())


def tensor_from_row(i: int, row: list[int], bytes_each: list[int],
                    storages: list[torch.UntypedStorage] | None) -> torch.Tensor:
    """Tensor ``i`` of a packed file from its row of ``"tensors"``: over its storage in ``storages``, or on the meta
    device when ``storages`` is None; ``ValueError`` if the row names no storage or dtype, reaches outside its
    storage (of ``bytes_each[index]`` bytes), or has more elements than its storage has room for."""
    index, code, offset, dims = row[:4]
    if not (0 <= index < len(bytes_each) and 0 <= code < len(DTYPES) and 0 <= dims <= (len(row) - 4) // 2
            and offset >= 0):
        raise ValueError(f"packed checkpoint: tensor {i}'s row {row[:4]} names no storage, dtype or shape")
    sizes, strides = row[4:4 + dims], row[4 + dims:4 + 2 * dims]
    dtype, room = DTYPES[code], bytes_each[index]
    last = offset + sum((size - 1) * stride for size, stride in zip(sizes, strides))
    if min(sizes, default=1) < 0 or min(strides, default=0) < 0 or offset * dtype.itemsize > room or (
            min(sizes, default=1) > 0 and ((last + 1) * dtype.itemsize > room
                                           or math.prod(sizes) * dtype.itemsize > room)):
        raise ValueError(f"packed checkpoint: tensor {i} (sizes {sizes}, strides {strides}, offset {offset}) lies "
                         f"outside its storage of {room} bytes")
    if storages is None:
        return torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
    storage = storages[index]
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, offset, sizes, strides)


def load_checkpoint(path: str | Path, shapes_only: bool = False, **torch_load: Any) -> Any:
    """The checkpoint in the file at ``path``, packed or not, read as tensors and plain containers only (on the CPU
    unless ``map_location`` says otherwise; other keywords go to ``torch.load``); ``shapes_only``: see ``unpack``
    (with ``mmap=True``, nothing but the tree and the table is read). How to read a checkpoint of this program
    outside it."""
    torch_load = {"map_location": "cpu", **torch_load, "weights_only": True}
    return unpack(torch.load(path, **torch_load), shapes_only)
