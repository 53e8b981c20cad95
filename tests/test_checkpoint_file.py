"""A checkpoint file packs its tensors into one byte buffer (issue 34: pickling ~230 small tensors one by one was
most of what a save cost): the layout by hand, the round trip, the state at save time, files written before packing,
and a packed file that does not add up."""

from __future__ import annotations

from collections import OrderedDict, defaultdict

import pytest
import torch

from lit_grpo.run.checkpoint_file import MARK, load_checkpoint, pack, unpack


def small_checkpoint() -> dict:
    weight = torch.arange(6.0).view(2, 3)
    state_dict = OrderedDict(weight=weight, column=weight[:, 1])  # a view: offset 1, stride 3
    state_dict._metadata = {"": {"version": 1}}  # what nn.Module.state_dict carries
    return {"epoch": 3, "state_dict": state_dict,
            "steps": [torch.tensor([7]), torch.tensor([1.5], dtype=torch.bfloat16)],
            "head": torch.nn.Parameter(torch.ones(2)), "note": ("x", 2)}


def test_the_layout_by_hand():
    packed = pack(small_checkpoint())
    assert packed["lit_grpo_packed_checkpoint"] == 1
    assert packed["storage_bytes"].tolist() == [24, 8, 2]  # six float32, one int64, one bfloat16
    # storage, dtype code (float32 0, int64 4, bfloat16 3), offset, dims, sizes, strides, zero-padded to 2 dims
    assert packed["tensors"].tolist() == [[0, 0, 0, 2, 2, 3, 3, 1],
                                          [0, 0, 1, 1, 2, 3, 0, 0],
                                          [1, 4, 0, 1, 1, 1, 0, 0],
                                          [2, 3, 0, 1, 1, 1, 0, 0]]
    expected = (torch.arange(6.0).numpy().tobytes() + torch.tensor([7]).numpy().tobytes()
                + bytes.fromhex("c03f"))  # 1.5 in bfloat16, little-endian
    assert bytes(packed["data"].tolist()) == expected
    tree = packed["tree"]
    assert tree["state_dict"] == {"weight": MARK + "0", "column": MARK + "1"}
    assert tree["steps"] == [MARK + "2", MARK + "3"]
    assert tree["state_dict"]._metadata == {"": {"version": 1}} and tree["epoch"] == 3 and tree["note"] == ("x", 2)
    assert type(tree["head"]) is torch.nn.Parameter  # not packed: pickled as torch.save pickles it


def test_a_packed_file_reads_back_as_the_checkpoint(tmp_path):
    torch.save(pack(small_checkpoint()), tmp_path / "x.ckpt")
    loaded = load_checkpoint(tmp_path / "x.ckpt")
    state_dict = loaded["state_dict"]
    assert type(state_dict) is OrderedDict and state_dict._metadata == {"": {"version": 1}}
    assert state_dict["weight"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert state_dict["column"].tolist() == [1.0, 4.0]
    assert state_dict["column"].stride() == (3,) and state_dict["column"].storage_offset() == 1
    assert state_dict["column"].untyped_storage().data_ptr() == state_dict["weight"].untyped_storage().data_ptr()
    assert loaded["steps"][0].dtype == torch.int64 and loaded["steps"][0].tolist() == [7]
    assert loaded["steps"][1].dtype == torch.bfloat16 and loaded["steps"][1].tolist() == [1.5]
    assert loaded["head"].tolist() == [1.0, 1.0] and loaded["epoch"] == 3 and loaded["note"] == ("x", 2)


def test_a_pack_holds_the_state_at_that_moment():
    checkpoint = small_checkpoint()
    packed = pack(checkpoint)
    checkpoint["state_dict"]["weight"].add_(100), checkpoint["steps"][0].fill_(0), checkpoint["head"].data.fill_(9)
    checkpoint["epoch"] = 4
    loaded = unpack(packed)
    assert loaded["state_dict"]["weight"][0].tolist() == [0.0, 1.0, 2.0] and loaded["steps"][0].tolist() == [7]
    assert loaded["head"].tolist() == [1.0, 1.0] and loaded["epoch"] == 3


def test_a_file_written_before_packing_reads_as_it_was(tmp_path):
    torch.save({"epoch": 1, "state_dict": {"w": torch.tensor([2.0, 3.0])}}, tmp_path / "old.ckpt")
    loaded = load_checkpoint(tmp_path / "old.ckpt")
    assert loaded["epoch"] == 1 and loaded["state_dict"]["w"].tolist() == [2.0, 3.0]


def test_shapes_only_reads_no_data_and_still_checks_the_table(tmp_path):
    torch.save(pack(small_checkpoint()), tmp_path / "x.ckpt")
    loaded = load_checkpoint(tmp_path / "x.ckpt", shapes_only=True, mmap=True)
    column = loaded["state_dict"]["column"]
    assert column.device.type == "meta" and column.shape == (2,) and column.stride() == (3,)
    assert loaded["steps"][1].dtype == torch.bfloat16 and loaded["epoch"] == 3
    damaged = pack(small_checkpoint())
    damaged["tensors"][0, 4] = 3  # the weight's rows: 3 x 3 floats in a storage of six
    with pytest.raises(ValueError, match=r"tensor 0 \(sizes \[3, 3\], strides \[3, 1\], offset 0\) lies outside"):
        unpack(damaged, shapes_only=True)


def test_a_zero_stride_expansion_is_pickled_as_torch_save_does_and_a_forged_one_refused():
    expanded = torch.tensor([2.0]).expand(1000)  # 1000 elements over 4 bytes
    packed = pack({"e": expanded})
    assert packed["tensors"].shape[0] == 0 and isinstance(packed["tree"]["e"], torch.Tensor)
    assert unpack(packed)["e"].tolist() == [2.0] * 1000
    forged = pack({"w": torch.tensor([2.0])})
    forged["tensors"] = torch.tensor([[0, 0, 0, 1, 2**40, 0]])  # 2^40 elements of stride 0 over one float
    with pytest.raises(ValueError, match="lies outside its storage of 4 bytes"):
        unpack(forged)
    forged = pack({"w": torch.tensor([2.0])})
    forged["data"] = torch.zeros(1, dtype=torch.uint8).expand(2**34)  # a few bytes of file, 16 GiB once copied
    forged["storage_bytes"] = torch.tensor([2**34])
    with pytest.raises(ValueError, match="each a contiguous tensor of its dtype and rank"):
        unpack(forged)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p["tensors"].__setitem__((0, 2), 5), "tensor 0 (sizes [2, 3], strides [3, 1], offset 5) lies outside "
                                                    "its storage of 24 bytes"),
    (lambda p: p["tensors"].__setitem__((2, 0), 9), "tensor 2's row [9, 4, 0, 1] names no storage, dtype or shape"),
    (lambda p: p["tensors"].__setitem__((2, 1), 99), "tensor 2's row [1, 99, 0, 1] names no storage, dtype or shape"),
    (lambda p: p["storage_bytes"].__setitem__(0, 25), "storages (35 bytes) do not fill its data (34 bytes)"),
    (lambda p: p["tree"]["steps"].append(MARK + "4"), "names tensor 4 of 4"),
    (lambda p: p.update(lit_grpo_packed_checkpoint=2), "packed checkpoint version 2; this lit-grpo reads version 1"),
    (lambda p: p.update(lit_grpo_packed_checkpoint=torch.ones(2)), "packed checkpoint version tensor"),
    (lambda p: p.pop("data"), "packed checkpoint without its data, storage_bytes, tensors or tree"),
])
def test_a_packed_file_that_does_not_add_up_says_what(damage, message):
    packed = pack(small_checkpoint())
    damage(packed)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        unpack(packed)


def test_a_string_that_begins_like_a_packed_tensor_is_refused_when_packing():
    with pytest.raises(ValueError, match="it begins with the marker of a packed tensor"):
        pack({"note": MARK + "0"})


def test_a_pack_keeps_container_types_and_owns_its_values():
    counts, shared = defaultdict(list, seen=[1]), torch.ones(3)
    state = {"counts": counts, "pair": (shared, shared[1:]), "note": "x", "head": torch.nn.Parameter(torch.ones(2))}
    packed = pack(state)
    counts["seen"].append(2), counts["new"].append(3), shared.fill_(5), state["head"].data.fill_(9)
    assert type(packed["tree"]["counts"]) is defaultdict and packed["tree"]["counts"].default_factory is list
    copied = unpack(packed)
    assert copied["counts"] == {"seen": [1]} and copied["note"] == "x" and copied["head"].tolist() == [1.0, 1.0]
    assert copied["pair"][0].tolist() == [1.0, 1.0, 1.0] and copied["pair"][1].tolist() == [1.0, 1.0]
    assert copied["pair"][1].untyped_storage().data_ptr() == copied["pair"][0].untyped_storage().data_ptr()
