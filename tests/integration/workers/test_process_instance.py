"""ProcessInstance serving real ONNX models from real worker processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from modelyard.errors import InvalidInputError, ModelNotReadyError, WorkerCrashedError
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.instance import StartRequest
from modelyard.workers.process import ProcessInstance
from tests.fakes.fault_models import SLOW

from .conftest import MLP_IN, TYPES, Starter, fault_spec, onnx_spec

WARM_START_LIMIT_S = 0.5
"""Generous bound for a forked start (typically ~10 ms); a cold spawn takes far longer."""


def _in_process(version_dir: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(
        str(version_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return [np.asarray(v) for v in session.run(None, feeds)]


def _has_exited(pid: int) -> bool:
    """Gone, or a zombie its reaper (the fork server) has not collected yet: either way
    its memory is freed (a stop returns at the exit, not at the reaping)."""
    try:
        # Dead (X): its parent is reaping it right now.
        return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return True


async def test_mlp_matches_onnxruntime_in_process(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["mlp"]))
    x = np.random.default_rng(1).standard_normal((5, MLP_IN)).astype(np.float32)

    out = await instance.infer({"x": x}, timeout_s=5.0)

    (expected,) = _in_process(onnx_dirs["mlp"], {"x": x})
    assert out["y"].dtype == np.float32
    np.testing.assert_array_equal(out["y"], expected)


async def test_start_reports_tensors_footprint_and_timings(
    factory: WorkerFactory, onnx_dirs: dict[str, Path]
) -> None:
    instance = ProcessInstance(factory)
    info = await instance.start(StartRequest(onnx_spec(onnx_dirs["mlp"], "mlp")))
    try:
        assert [t.name for t in info.inputs] == ["x"]
        assert [t.name for t in info.outputs] == ["y"]
        assert info.supports_batching
        assert info.pid is not None
        assert info.pid == instance.pid
        assert info.details["start_method"] == "fork"
        assert info.footprint_bytes == info.details["uss_bytes"]
        rss, uss, pss = (int(str(info.details[k])) for k in ("rss_bytes", "uss_bytes", "pss_bytes"))
        assert 0 < uss <= pss <= rss
        assert 0 < info.process_start_s < WARM_START_LIMIT_S
        assert info.load_s > 0
        assert info.warmup_s > 0
        sample = await instance.sample_memory()
        assert sample.rss_bytes > 0
    finally:
        await instance.stop()


async def test_a_deferred_start_serves_first_and_measures_after(
    factory: WorkerFactory, onnx_dirs: dict[str, Path]
) -> None:
    """``defer_footprint``: the start reads no memory (the model serves at once); the
    footprint comes from ``measure_footprint`` afterwards, the same USS a start measures."""
    instance = ProcessInstance(factory)
    spec = onnx_spec(onnx_dirs["mlp"], "mlp")
    info = await instance.start(StartRequest(spec, defer_footprint=True))
    try:
        assert info.footprint_pending
        assert "uss_bytes" not in info.details, "measured inside the start after all"
        x = np.ones((1, MLP_IN), np.float32)
        (expected,) = _in_process(onnx_dirs["mlp"], {"x": x})
        out = await instance.infer({"x": x}, timeout_s=5.0)
        np.testing.assert_array_equal(out["y"], expected)
        measured = await instance.measure_footprint()
        assert not measured.footprint_pending
        uss = int(str(measured.details["uss_bytes"]))
        assert measured.footprint_bytes == uss > 0
        assert measured.details["start_method"] == info.details["start_method"]
    finally:
        await instance.stop()
    with pytest.raises(ModelNotReadyError):
        await instance.measure_footprint()


async def test_a_deferred_footprint_is_read_after_the_first_answer(factory: WorkerFactory) -> None:
    """Asked to (a request waited for the load), the footprint read (a walk of every
    mapping, 10-45 ms of CPU) waits until the first request sent right after the start
    has had its answer, so that it does not run beside it (a generative model's first
    token); then it measures as before."""
    instance = ProcessInstance(factory)
    await instance.start(StartRequest(fault_spec("FaultyModel"), defer_footprint=True))
    try:
        done: list[str] = []

        async def first_request() -> None:
            slow = np.full((1, 1), SLOW, np.float32)  # answered after 0.3 s
            await instance.infer({"x": slow}, timeout_s=5.0)
            done.append("answer")

        async def measure() -> None:
            await instance.measure_footprint(after_first_answer=True)
            done.append("footprint")

        await asyncio.gather(measure(), first_request())
        assert done == ["answer", "footprint"]
    finally:
        await instance.stop()


async def test_stop_returns_once_the_worker_has_gone_not_once_reported(
    factory: WorkerFactory, onnx_dirs: dict[str, Path]
) -> None:
    """A stop (whose return frees the model's budget) ends when the worker's process has
    exited, seen through its pidfd, not one hop later when the fork server has reaped it
    and reported the code: a paused fork server delays only the report."""
    instance = ProcessInstance(factory)
    await instance.start(StartRequest(onnx_spec(onnx_dirs["identity"], "identity")))
    pid = instance.pid
    assert pid is not None
    assert factory.fork_server_info is not None
    fork_server = psutil.Process(factory.fork_server_info.pid)
    fork_server.suspend()
    try:
        # Well within the stop grace (1 s): the report never comes while paused.
        await asyncio.wait_for(instance.stop(), 0.8)
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, "exited, not reaped"
    finally:
        fork_server.resume()


async def test_every_datatype_round_trips(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["types"]))
    feeds: dict[str, np.ndarray] = {
        "f32": np.array([[1.5, -2]], np.float32),
        "f16": np.array([[0.5, 3]], np.float16),
        "f64": np.array([[1e300, -0.0]], np.float64),
        "i8": np.array([[-128, 127]], np.int8),
        "i32": np.array([[-(2**31), 7]], np.int32),
        "i64": np.array([[2**62, -1]], np.int64),
        "u8": np.array([[0, 255]], np.uint8),
        "b": np.array([[True, False]], np.bool_),
        "s": np.array([["héllo", ""]], dtype=object),
    }
    assert set(feeds) == set(TYPES)

    out = await instance.infer(feeds, timeout_s=5.0)

    for name, value in feeds.items():
        got = out[f"{name}_out"]
        assert got.shape == value.shape, name
        if name == "s":
            assert got.tolist() == value.tolist()  # ONNX Runtime answers str, as in-process
        else:
            assert got.dtype == value.dtype, name
            np.testing.assert_array_equal(got, value)


async def test_bytes_tensors_round_trip_exactly(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("RawEchoModel"))
    blobs = np.array([[b"", b"\x00\xff binary"], [b"x" * 70_000, b"text"]], dtype=object)

    out = await instance.infer({"blob": blobs, "n": np.arange(3, dtype=np.int16)}, timeout_s=5.0)

    assert out["blob_out"].dtype == object
    assert out["blob_out"].shape == (2, 2)
    assert out["blob_out"].tolist() == blobs.tolist()
    assert all(type(b) is bytes for b in out["blob_out"].ravel())
    np.testing.assert_array_equal(out["n_out"], np.arange(3, dtype=np.int16))


async def test_batches_larger_than_the_region_grow_it(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))
    for rows in (1, 300_000, 3, 700_000):  # 4.8 MB and 11 MB batches; the region starts at 1 MiB
        x = np.random.default_rng(rows).random((rows, 4), dtype=np.float32)
        out = await instance.infer({"x": x}, timeout_s=10.0)
        np.testing.assert_array_equal(out["y"], x)


async def test_results_are_copies_not_views_of_the_region(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))
    a = np.full((2, 4), 1.0, np.float32)
    first = await instance.infer({"x": a}, timeout_s=5.0)
    await instance.infer({"x": a * 7}, timeout_s=5.0)
    np.testing.assert_array_equal(first["y"], a)


async def test_concurrent_calls_are_serialised_and_each_gets_its_own_answer(
    start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))
    inputs = [np.full((i + 1, 4), i, np.float32) for i in range(20)]

    outs = await asyncio.gather(*(instance.infer({"x": x}, timeout_s=10.0) for x in inputs))

    for x, out in zip(inputs, outs, strict=True):
        np.testing.assert_array_equal(out["y"], x)


async def test_a_cancelled_call_does_not_disturb_the_next(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    slow = asyncio.ensure_future(
        instance.infer({"x": np.ones(3, np.float32), "delay_ms": np.array([300], np.int32)}, 5.0)
    )
    await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow

    x = np.arange(4, dtype=np.float32)
    out = await instance.infer({"x": x, "delay_ms": np.array([0], np.int32)}, timeout_s=5.0)

    np.testing.assert_array_equal(out["y"], x)
    assert instance.is_alive


async def test_a_model_error_comes_back_typed_and_the_worker_keeps_serving(
    start_instance: Starter,
) -> None:
    instance = await start_instance(fault_spec("RaisingModel"))

    with pytest.raises(InvalidInputError, match="negative values are not allowed") as info:
        await instance.infer({"x": np.array([-1.0], np.float32)}, timeout_s=5.0)

    assert any("worker traceback" in note for note in getattr(info.value, "__notes__", []))
    out = await instance.infer({"x": np.array([2.0], np.float32)}, timeout_s=5.0)
    np.testing.assert_array_equal(out["y"], [2.0])


async def test_unsendable_input_is_invalid_input(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("RawEchoModel"))
    with pytest.raises(InvalidInputError, match="expected bytes or str"):
        await instance.infer({"o": np.array([object()], dtype=object)}, timeout_s=5.0)
    assert instance.is_alive


async def test_stop_ends_the_process_and_gives_its_memory_back(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("LeakyModel"))
    await instance.infer({"x": np.array([[64]], np.float32)}, timeout_s=10.0)
    held = await instance.sample_memory()
    assert held.uss_bytes > 64 * 1024 * 1024
    pid = instance.pid
    assert pid is not None

    await instance.stop()

    assert not instance.is_alive
    assert _has_exited(pid), "its memory is the system's again"
    with pytest.raises(ModelNotReadyError):
        await instance.infer({"x": np.array([[0]], np.float32)}, timeout_s=1.0)


async def test_stop_of_a_busy_worker_kills_it_after_the_grace(start_instance: Starter) -> None:
    instance = await start_instance(fault_spec("HangingModel"))
    call = asyncio.ensure_future(
        instance.infer({"x": np.ones(1, np.float32), "delay_ms": np.array([-1], np.int32)}, 30.0)
    )
    await asyncio.sleep(0.05)
    pid = instance.pid
    assert pid is not None
    t0 = time.monotonic()

    await instance.stop()

    assert time.monotonic() - t0 < 3.0
    assert not psutil.pid_exists(pid)
    with pytest.raises(WorkerCrashedError, match="stop grace"):
        await call


async def test_a_warm_start_is_fast(
    factory: WorkerFactory, start_instance: Starter, onnx_dirs: dict[str, Path]
) -> None:
    instance = await start_instance(onnx_spec(onnx_dirs["identity"]))
    info_start = time.perf_counter()
    second = await start_instance(onnx_spec(onnx_dirs["identity"]))
    elapsed = time.perf_counter() - info_start
    assert instance.is_alive
    assert second.is_alive
    assert factory.fork_server_info is not None
    assert elapsed < WARM_START_LIMIT_S
