"""Batch formation and tensor (de)batching: pure functions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from modelyard.scheduling.batcher import (
    BatchKey,
    batch_key,
    concat_inputs,
    row_count,
    select_batch,
    split_outputs,
)

from ._fakes import reference_model, tensor

KEY_A: BatchKey = (("x", np.dtype("<f4"), (3,)),)
KEY_B: BatchKey = (("x", np.dtype("<f4"), (4,)),)


@dataclass
class Item:
    name: str
    rows: int
    batch_key: BatchKey | None = KEY_A


def names(items: list[Item]) -> list[str]:
    return [i.name for i in items]


def test_batch_key_matches_on_names_dtypes_and_trailing_shapes() -> None:
    assert batch_key({"x": tensor(1, rows=1)}) == batch_key({"x": tensor(2, rows=5)})
    assert batch_key({"x": tensor(1, width=3)}) != batch_key({"x": tensor(1, width=4)})
    assert batch_key({"x": tensor(1)}) != batch_key({"x": tensor(1, dtype="float64")})
    assert batch_key({"x": tensor(1)}) != batch_key({"z": tensor(1)})


@pytest.mark.parametrize(
    "inputs",
    [{}, {"x": np.float32(1.0) * np.ones(())}, {"x": tensor(1, rows=2), "m": tensor(1, rows=3)}],
    ids=["no-inputs", "scalar", "disagreeing-rows"],
)
def test_unbatchable_inputs_have_no_key(inputs: dict[str, np.ndarray]) -> None:
    assert batch_key(inputs) is None


def test_row_count_is_axis_zero() -> None:
    assert row_count({"x": tensor(1, rows=4)}) == 4
    assert row_count({"x": np.ones(())}) == 1


def test_select_fills_up_to_max_rows_and_skips_other_keys() -> None:
    items = [Item("a", 2), Item("other", 1, KEY_B), Item("b", 1), Item("c", 1), Item("d", 1)]
    selection = select_batch(items, max_rows=4)
    assert selection is not None
    assert names(selection.entries) == ["a", "b", "c"]
    assert selection.rows == 4
    assert selection.is_ready


def test_select_stops_at_first_request_that_does_not_fit() -> None:
    items = [Item("a", 2), Item("big", 3), Item("small", 1)]
    selection = select_batch(items, max_rows=4)
    assert selection is not None
    assert names(selection.entries) == ["a"]
    assert selection.is_ready  # waiting cannot add "big" to this batch


def test_oversized_request_runs_alone() -> None:
    selection = select_batch([Item("huge", 9), Item("b", 1)], max_rows=4)
    assert selection is not None
    assert names(selection.entries) == ["huge"]
    assert selection.is_ready


def test_partial_batch_is_not_ready() -> None:
    selection = select_batch([Item("a", 1), Item("b", 1)], max_rows=8)
    assert selection is not None
    assert names(selection.entries) == ["a", "b"]
    assert not selection.is_ready


def test_longest_preferred_prefix_is_ready_at_once() -> None:
    items = [Item(str(i), 1) for i in range(5)]
    selection = select_batch(items, max_rows=8, preferred_sizes=(2, 4))
    assert selection is not None
    assert names(selection.entries) == ["0", "1", "2", "3"]
    assert selection.is_ready


@pytest.mark.parametrize(
    ("head", "batching"),
    [(Item("a", 1), False), (Item("a", 1, None), True)],
    ids=["batching-off", "unbatchable-head"],
)
def test_head_runs_alone(head: Item, batching: bool) -> None:
    selection = select_batch([head, Item("b", 1)], max_rows=8, is_batching=batching)
    assert selection is not None
    assert names(selection.entries) == ["a"]
    assert selection.is_ready


def test_empty_queue_selects_nothing() -> None:
    assert select_batch([], max_rows=4) is None


def test_concat_then_split_equals_running_each_alone() -> None:
    requests = [{"x": tensor(i, rows=rows)} for i, rows in enumerate([1, 3, 2])]
    batched = reference_model(concat_inputs(requests))
    parts = split_outputs(batched, [1, 3, 2])
    for request, part in zip(requests, parts, strict=True):
        expected = reference_model(request)
        assert part.keys() == expected.keys()
        for name in expected:
            np.testing.assert_array_equal(part[name], expected[name])


def test_split_rejects_outputs_without_the_batch_rows() -> None:
    with pytest.raises(ValueError, match="axis 0"):
        split_outputs({"y": np.zeros((2, 3))}, [1, 2])


def test_a_batch_never_holds_more_elements_than_the_element_cap() -> None:
    # KEY_A rows have 3 elements: 10 elements allow 3 rows, whatever max_rows says.
    items = [Item("a", 2), Item("b", 1), Item("c", 1), Item("d", 1)]
    selection = select_batch(items, max_rows=8, max_elements=10)
    assert selection is not None
    assert names(selection.entries) == ["a", "b"]
    assert selection.is_ready
    # A request over the cap alone (the decoder allowed it) still runs, alone.
    alone = select_batch([Item("big", 5), Item("b", 1)], max_rows=8, max_elements=10)
    assert alone is not None
    assert names(alone.entries) == ["big"]
