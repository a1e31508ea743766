"""The shared region: tensors in and out, BYTES length-prefixed, growth on demand."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from modelyard.workers.channel import ALIGN_BYTES, MIN_REGION_BYTES, SharedRegion
from modelyard.workers.messages import TensorMeta


@pytest.fixture
def region() -> Iterator[SharedRegion]:
    r = SharedRegion.create()
    yield r
    r.close()


FIXED: dict[str, np.ndarray] = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f16": np.array([0.5, -1], np.float16),
    "i64": np.array([[2**62]], np.int64),
    "b": np.array([True, False, True]),
    "u": np.array(["ab", "c"]),
    "scalar": np.array(3.5),
    "empty": np.zeros((0, 4), np.float32),
    "strided": np.arange(20, dtype=np.int32)[::3],
}


def test_fixed_width_tensors_round_trip(region: SharedRegion) -> None:
    metas, end = region.write(FIXED)
    out = region.read(metas, copy=True)
    assert end % ALIGN_BYTES == 0
    assert all(m.offset % ALIGN_BYTES == 0 for m in metas)
    for name, value in FIXED.items():
        assert out[name].dtype == value.dtype
        np.testing.assert_array_equal(out[name], value)


def test_views_alias_the_region_and_copies_do_not(region: SharedRegion) -> None:
    metas, _ = region.write({"x": np.zeros(4, np.float32)})
    view = region.read(metas, copy=False)["x"]
    copy = region.read(metas, copy=True)["x"]
    region.write({"x": np.ones(4, np.float32)})
    np.testing.assert_array_equal(view, np.ones(4))
    np.testing.assert_array_equal(copy, np.zeros(4))


def test_bytes_and_str_tensors_keep_their_element_type(region: SharedRegion) -> None:
    raw = np.array([[b"", b"\x00\x01"], [b"abc", b"z" * 1000]], dtype=object)
    text = np.array(["héllo", "", "wörld"], dtype=object)
    metas, _ = region.write({"raw": raw, "text": text})
    out = region.read(metas, copy=True)
    assert out["raw"].tolist() == raw.tolist()
    assert out["text"].tolist() == text.tolist()
    assert {type(v) for v in out["raw"].ravel()} == {bytes}
    assert {type(v) for v in out["text"].ravel()} == {str}
    assert [m.dtype for m in metas] == ["BYTES", "STR"]


def test_object_arrays_of_other_things_are_refused(region: SharedRegion) -> None:
    with pytest.raises(TypeError, match="expected bytes or str"):
        region.write({"o": np.array([1, None], dtype=object)})


def test_a_large_batch_grows_the_region_and_the_peer_follows(region: SharedRegion) -> None:
    peer = SharedRegion(os.dup(region.fd), region.size)
    big = np.random.default_rng(0).random(MIN_REGION_BYTES, dtype=np.float32)  # 4 MiB
    try:
        metas, end = region.write({"big": big})
        assert region.size >= end > MIN_REGION_BYTES
        peer.remap(region.size)
        np.testing.assert_array_equal(peer.read(metas, copy=False)["big"], big)
    finally:
        peer.close()


def test_reading_past_the_region_is_refused(region: SharedRegion) -> None:
    metas, _ = region.write({"x": np.zeros(4, np.float32)})
    bad = (TensorMeta("x", "<f4", (1 << 30,), metas[0].offset, 4 << 30),)
    with pytest.raises(ValueError, match="past the shared region"):
        region.read(bad, copy=True)


def test_repeated_layouts_read_and_write_the_current_bytes(region: SharedRegion) -> None:
    # The same tensor at the same offset, call after call (the region caches its views).
    for i in range(3):
        x = np.full((2, 3), float(i), dtype=np.float32)
        metas, _ = region.write({"x": x})
        got = region.read(metas, copy=False)["x"]
        np.testing.assert_array_equal(got, x)
        got.shape = (6,)  # whoever holds a result may reshape it; the next read is intact
        np.testing.assert_array_equal(region.read(metas, copy=True)["x"], x)
    # After growing (a new mapping), the same layout reads the new mapping's bytes.
    region.write({"big": np.ones(region.size, dtype=np.uint8)})
    metas, _ = region.write({"x": np.full((2, 3), 7.0, dtype=np.float32)})
    assert region.read(metas, copy=True)["x"].tolist() == [[7.0] * 3] * 2


def test_closing_a_region_releases_both_of_its_descriptors() -> None:
    # mmap keeps a duplicate of the memfd; the view cache keeps the mmap alive. Closing
    # must release both at once, not when the collector gets round to the region.
    before = len(os.listdir("/proc/self/fd"))
    region = SharedRegion.create()
    region.write({"x": np.ones((4, 4), np.float32)})
    assert len(os.listdir("/proc/self/fd")) == before + 2
    region.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_write_after_places_outputs_past_the_inputs_as_write_does(region: SharedRegion) -> None:
    inputs, _ = region.write({"x": np.zeros((2, 3), np.float32)})
    metas = region.write_after({"y": np.ones(5, np.int64)}, inputs)
    assert metas[0].offset == region.end_of(inputs)
    np.testing.assert_array_equal(region.read(metas, copy=True)["y"], np.ones(5))


def test_write_after_reuses_a_layout_only_while_it_matches(region: SharedRegion) -> None:
    inputs, _ = region.write({"x": np.zeros(4, np.float32)})
    first = region.write_after({"y": np.full(3, 1.0, np.float32)}, inputs)
    again = region.write_after({"y": np.full(3, 2.0, np.float32)}, inputs)
    assert again is first  # the same layout: only the bytes were copied
    np.testing.assert_array_equal(region.read(again, copy=True)["y"], [2.0, 2.0, 2.0])
    changes: list[tuple[dict[str, np.ndarray], tuple[TensorMeta, ...]]] = [
        ({"y": np.full(4, 3.0, np.float32)}, inputs),  # another shape
        ({"y": np.full(4, 4, np.int32)}, inputs),  # another dtype
        ({"z": np.full(4, 5, np.int32)}, inputs),  # another name
        ({"z": np.full(4, 6, np.int32), "w": np.ones(2)}, inputs),  # another count
        ({"z": np.array([b"ab", b"c"], dtype=object)}, inputs),  # BYTES: never reused
        ({"z": np.full(4, 7, np.int32)}, region.write({"x": np.zeros(40, np.float32)})[0]),
    ]
    for outputs, after in changes:
        metas = region.write_after(outputs, after)
        assert metas[0].offset == region.end_of(after)
        out = region.read(metas, copy=True)
        for name, value in outputs.items():
            assert out[name].tolist() == value.tolist()


def test_write_after_follows_a_new_mapping(region: SharedRegion) -> None:
    inputs, _ = region.write({"x": np.zeros(4, np.float32)})
    first = region.write_after({"y": np.zeros(3, np.float32)}, inputs)
    region.ensure(MIN_REGION_BYTES * 3)  # remapped: the old views are of the old mapping
    metas = region.write_after({"y": np.full(3, 9.0, np.float32)}, inputs)
    assert metas is not first
    peer = SharedRegion(os.dup(region.fd), region.size)
    try:
        np.testing.assert_array_equal(peer.read(metas, copy=True)["y"], [9.0, 9.0, 9.0])
    finally:
        peer.close()


def test_write_reuses_a_layout_only_from_the_same_start(region: SharedRegion) -> None:
    first, end = region.write({"x": np.zeros(4, np.float32)})
    again, again_end = region.write({"x": np.ones(4, np.float32)})
    assert again is first  # only the bytes were copied
    assert again_end == end
    np.testing.assert_array_equal(region.read(again, copy=True)["x"], np.ones(4))
    moved, _ = region.write({"x": np.full(4, 2.0, np.float32)}, start=end)
    assert moved[0].offset == end
    strided = np.arange(12, dtype=np.float32)[::3]  # same layout, not contiguous
    assert region.write({"x": strided})[0] == first  # the start changed back: rebuilt
    np.testing.assert_array_equal(region.read(first, copy=True)["x"], strided)
    wider, _ = region.write({"x": np.full(5, 3.0, np.float32)})
    assert wider[0].shape == (5,)
    np.testing.assert_array_equal(region.read(wider, copy=True)["x"], np.full(5, 3.0))
