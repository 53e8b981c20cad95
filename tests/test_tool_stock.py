"""The stockroom task (configs/tools_stock.yaml): each call's reward and when the environment ends the episode,
worked by hand, and its rows."""

from __future__ import annotations

import pytest

from lit_grpo.tasks.tools.stock import Stockroom, stock_rows


def fresh(kinds: int = 3, stock: tuple[int, ...] = (5, 7, 11)) -> Stockroom:
    room = Stockroom()
    room.reset(kinds=kinds, stock=list(stock), prompt="ignored")
    return room


def test_the_plan_earns_each_count_and_the_submission():
    room = fresh()
    assert room.count(1) == "item 1: 5 counted, register 5"
    assert room.count(2) == "item 2: 7 counted, register 12"
    assert room.count(3) == "item 3: 11 counted, register 23"
    assert not room.finished
    assert room.submit() == "submitted 23"
    assert room.rewards == [0.2, 0.2, 0.2, 1.0]  # return 1.6 = 1 + 0.2 * 3
    assert room.finished


def test_wasted_calls_cost_and_an_early_submission_earns_nothing():
    room = fresh()
    room.count(2)  # +0.2
    assert room.count(2) == "item 2 was counted already"  # -0.2
    assert room.count(4) == "item 4 is not stocked here"  # -0.2: only 3 kinds
    assert room.count(0) == "item 0 is not stocked here"
    assert room.count("1") == "item 1 is not stocked here"  # a string is not a kind's number
    assert room.look(1) == "item 1 is on shelf 4"  # 1 * 3 % 7 + 1; -0.2 though it names a stocked kind
    assert room.submit() == "submitted 7"  # kinds 1 and 3 never counted
    assert room.rewards == [0.2, -0.2, -0.2, -0.2, -0.2, -0.2, 0.0]
    assert room.register == 7 and room.counted == [2] and room.finished


def test_order_does_not_matter_and_reset_starts_over():
    room = fresh(kinds=2, stock=(1, 2))
    room.count(2)
    room.count(1)
    room.submit()
    assert room.rewards == [0.2, 0.2, 1.0]
    room.reset(kinds=2, stock=[3, 4])
    assert (room.rewards, room.finished, room.register, room.counted) == ([], False, 0, [])


@pytest.mark.parametrize("seed", [0, 1])
def test_rows_are_distinct_shops_of_two_to_four_kinds(seed):
    rows = stock_rows(200, seed)
    assert len({r["prompt"] for r in rows}) == 200
    assert {r["kinds"] for r in rows} == {2, 3, 4}
    assert all(len(r["stock"]) == r["kinds"] and all(1 <= s <= 60 for s in r["stock"]) for r in rows)
    first = rows[0]
    assert first["prompt"].endswith(f"stocks {first['kinds']} kinds of item, numbered 1 to {first['kinds']}. Count "
                                    "each kind into the register once, then submit.")
    assert stock_rows(200, seed) == rows  # the seed decides them
