"""Lifecycle faults found by probing: impatient callers, failed or slow loads, removal, close."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import psutil
import pytest

from modelyard.app import App
from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.polling import wait_until
from tests.servers import running_server, write_config

FAKES = Path(__file__).resolve().parents[1] / "fakes"
MIB = 1024 * 1024


def slow_model(root: Path, name: str, load_s: float, **fields: Any) -> dict[str, Any]:
    """A ``runtime: python`` echo model under ``root/name/1`` whose every load takes ``load_s``."""
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True)
    # Each model gets its own module name: one process may import several.
    module = name.replace("-", "_") + "_model"
    shutil.copy(FAKES / "slow_load_model.py", version_dir / f"{module}.py")
    (version_dir / "load_s").write_text(str(load_s))
    return {"name": name, "path": name, "runtime": "python", "class": f"{module}:SlowLoadModel"}


def x_body(value: float = 0.5, **parameters: Any) -> dict[str, Any]:
    """An infer body for the echo models (``x``: FP32 [1, 1])."""
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}]
    }
    if parameters:
        body["parameters"] = parameters
    return body


async def index_row(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """The repository index row of ``name`` (its default version)."""
    rows = (await client.post("/v2/repository/index", json={})).json()
    row: dict[str, Any] = next(r for r in rows if r["name"] == name)
    return row


async def wait_for_state(app: App, name: str, state: str, within_s: float = 10.0) -> None:
    """Poll until ``name``'s default version is in ``state``."""
    record = app.manager.resolve(name, None)
    await wait_until(lambda: record.state.value == state, within_s, what=f"{name} is {state}")


def _descendants() -> set[int]:
    """Process ids of this (the server's) process tree that still run."""
    found = set()
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE:
                found.add(p.pid)
    return found


def events(app: App, kind: str, name: str) -> int:
    """How many ``kind`` events ``name`` has had."""
    return sum(1 for e in app.manager.events.recent() if e.kind == kind and e.model == name)


# ------------------------------------------------------------------ item 1: impatient callers


async def test_an_impatient_request_never_fails_the_model_for_everyone(tmp_path: Path) -> None:
    # ``first`` loads slowly and holds 60 of the 100 MiB: ``second`` (60 MiB) must wait for
    # memory until ``first`` is READY (measured, or evictable). A 50 ms caller gives up.
    models = [
        {**slow_model(tmp_path, "first", 1.0), "memory_mb": 60},
        {**slow_model(tmp_path, "second", 0.05), "memory_mb": 60},
    ]
    cfg = write_config(tmp_path, models, devices=[{"name": "cpu", "memory_budget_mb": 100}])
    async with running_server(cfg) as (app, client):
        first = asyncio.create_task(client.post("/v2/models/first/infer", json=x_body()))
        await wait_for_state(app, "first", "LOADING")
        impatient = await client.post("/v2/models/second/infer", json=x_body(timeout=50_000))
        assert impatient.status_code == 504, impatient.text
        row = await index_row(client, "second")
        assert row["state"] != "FAILED", row
        patient = await client.post("/v2/models/second/infer", json=x_body(0.25))
        assert patient.status_code == 200, patient.text
        assert patient.json()["outputs"][0]["data"] == [0.25]
        assert (await first).status_code == 200
        assert events(app, "load_failed", "second") == 0


async def test_a_caller_giving_up_on_a_slow_load_leaves_the_load_running(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, [slow_model(tmp_path, "slow", 0.6)])
    async with running_server(cfg) as (app, client):
        r = await client.post("/v2/models/slow/infer", json=x_body(timeout=100_000))
        assert r.status_code == 504, r.text
        await wait_for_state(app, "slow", "READY")
        assert (await client.post("/v2/models/slow/infer", json=x_body())).status_code == 200


async def test_a_load_is_bounded_by_its_own_load_timeout(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, [{**slow_model(tmp_path, "slow", 5.0), "load_timeout_ms": 300}])
    async with running_server(cfg) as (app, client):
        t0 = time.monotonic()
        r = await client.post("/v2/models/slow/infer", json=x_body())
        assert time.monotonic() - t0 < 3.0, "the load ran past its load_timeout_ms"
        assert r.status_code == 503, r.text
        assert "load timeout (300 ms)" in r.json()["error"]
        row = await index_row(client, "slow")
        assert row["state"] == "FAILED"
        assert "load timeout" in row["reason"]
        assert app.manager.budget.device("cpu").reserved_bytes == 0


# ------------------------------------------------------------------ item 7: cold first requests


async def test_a_cold_models_first_request_does_not_time_out_by_design(tmp_path: Path) -> None:
    # The load (0.6 s) is longer than the model's timeout_ms (200): the request gets its
    # 200 ms after the load, as the example's iris-skops (1.1-1.3 s load, 1000 ms) needs.
    cfg = write_config(tmp_path, [{**slow_model(tmp_path, "slow", 0.6), "timeout_ms": 200}])
    async with running_server(cfg) as (_, client):
        r = await client.post("/v2/models/slow/infer", json=x_body(0.75))
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [0.75]
        # /predict loads through the metadata route: the same rule holds there.
        unload = await client.post("/v2/repository/models/slow/unload")
        assert unload.status_code == 200
        p = await client.post("/predict", json={"model": "slow", "inputs": {"x": [0.5]}})
        assert p.status_code == 200, p.text


async def test_the_clients_own_deadline_still_caps_a_cold_request(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, [{**slow_model(tmp_path, "slow", 0.6), "timeout_ms": 200}])
    async with running_server(cfg) as (_, client):
        t0 = time.monotonic()
        r = await client.post(
            "/v2/models/slow/infer", json=x_body(), headers={"X-Modelyard-Timeout-Ms": "150"}
        )
        assert r.status_code == 504, r.text
        assert time.monotonic() - t0 < 0.5


# ------------------------------------------------------------------ item 2: failed loads


@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    """``broken``: one version whose model file is not ONNX (yet)."""
    (tmp_path / "repo" / "broken" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return tmp_path / "repo"


@contextlib.asynccontextmanager
async def broken_server(tmp_path: Path, repo: Path) -> AsyncIterator[tuple[App, Any, Any]]:
    cfg = write_config(tmp_path, [{"name": "broken", "path": "broken"}], model_repository=str(repo))
    async with (
        running_server(cfg, grpc=True) as (app, client),
        grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        yield app, client, stub


ADD_BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]}
GRPC_ADD_REQUEST = pb.ModelInferRequest(
    model_name="broken",
    inputs=[
        pb.ModelInferRequest.InferInputTensor(
            name="input",
            datatype="FP32",
            shape=[1, 4],
            contents=pb.InferTensorContents(fp32_contents=[0.0] * 4),
        )
    ],
)


async def test_a_failed_load_answers_503_with_retry_after_and_backs_off(
    tmp_path: Path, broken_repo: Path
) -> None:
    async with broken_server(tmp_path, broken_repo) as (app, client, stub):
        r = await client.post("/v2/models/broken/infer", json=ADD_BODY)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert "broken" in r.json()["error"]
        row = await index_row(client, "broken")
        assert row["state"] == "FAILED"
        assert row["reason"]
        # Within the backoff: the same answer, at once, without another load.
        again = await client.post("/v2/models/broken/infer", json=ADD_BODY)
        assert again.status_code == 503
        assert again.headers["retry-after"] == "1"
        assert events(app, "load_failed", "broken") == 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(GRPC_ADD_REQUEST)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        # grpc-stubs types these as the sync API's objects; grpc.aio returns a Metadata.
        trailers: Any = info.value.trailing_metadata()
        assert dict(trailers)["retry-after"] == "1"
        # After it, one retry, which fails again: the wait doubles.
        while events(app, "load_failed", "broken") == 1:
            retry = await client.post("/v2/models/broken/infer", json=ADD_BODY)
            assert retry.status_code == 503
            row = await index_row(client, "broken")
            assert row["state"] == "FAILED", row
            assert row["reason"], row
            await asyncio.sleep(0.1)
        assert events(app, "load_failed", "broken") == 2
        doubled = await client.post("/v2/models/broken/infer", json=ADD_BODY)
        assert doubled.status_code == 503
        assert doubled.headers["retry-after"] == "2"
        # New files reset the backoff: the next request loads the fixed model at once.
        model_file = broken_repo / "broken" / "1" / "model.onnx"
        model_file.unlink()
        build_add_onnx(model_file, 1.0)
        fixed = await client.post("/v2/models/broken/infer", json=ADD_BODY)
        assert fixed.status_code == 200, fixed.text
        assert app.manager.resolve("broken", None).backoff.failures == 0


async def test_an_explicit_load_retries_a_failed_model_at_once(
    tmp_path: Path, broken_repo: Path
) -> None:
    async with broken_server(tmp_path, broken_repo) as (app, client, _):
        assert (await client.post("/v2/models/broken/infer", json=ADD_BODY)).status_code == 503
        explicit = await client.post("/v2/repository/models/broken/load")
        assert explicit.status_code == 503, explicit.text
        assert "retry-after" in explicit.headers
        assert events(app, "load_failed", "broken") == 2


# ------------------------------------------------------------------ item 5: removal while loading


async def test_removing_a_version_folder_while_it_loads_stops_the_load(tmp_path: Path) -> None:
    model = {**slow_model(tmp_path, "slow", 3.0), "memory_mb": 20}
    cfg = write_config(
        tmp_path,
        [model],
        model_control_mode="poll",
        poll_interval_s=0.05,
        poll_settle_s=0.1,
        spare_workers=0,  # the loading worker must be a new process in the tree
    )
    async with running_server(cfg) as (app, client):
        idle = _descendants()
        request = asyncio.create_task(client.post("/v2/models/slow/infer", json=x_body()))
        await wait_for_state(app, "slow", "LOADING")
        budget = app.manager.budget.device("cpu")
        assert budget.reserved_bytes == 20 * MIB
        give_up = time.monotonic() + 10
        while not (tmp_path / "slow" / "1" / "loading").exists():
            assert time.monotonic() < give_up, "the worker never began loading"
            await asyncio.sleep(0.02)
        assert _descendants() - idle, "the loading worker is not in the process tree"
        shutil.rmtree(tmp_path / "slow" / "1")
        t0 = time.monotonic()
        while "1" in app.manager.entry("slow").versions or budget.reserved_bytes:
            assert time.monotonic() - t0 < 2.0, "the removed version's load went on"
            await asyncio.sleep(0.02)
        while _descendants() - idle:
            assert time.monotonic() - t0 < 2.0, "the removed version's worker still runs"
            await asyncio.sleep(0.02)
        r = await request
        assert r.status_code in (404, 503), r.text
        assert time.monotonic() - t0 < 2.0, "the waiting request was answered late"
        assert events(app, "load_failed", "slow") == 0, "the load failed instead of stopping"
        assert events(app, "removed", "slow") == 1


# ------------------------------------------------------------------ item 9: owned tasks


async def test_stopping_the_server_cancels_a_load_in_progress(tmp_path: Path) -> None:
    # A load far longer than a slow CI machine's start and stop: only a stop that waited
    # for the load can come near it (CI, load average 5.7: a 5 s load and a 4 s bound
    # counted from before the start failed there).
    cfg = write_config(tmp_path, [slow_model(tmp_path, "slow", 60.0)])
    # The fixture checks that no task, worker or reservation is left after stop.
    async with running_server(cfg) as (app, client):
        request = asyncio.create_task(
            client.post("/v2/models/slow/infer", json=x_body(timeout=100_000))
        )
        await wait_for_state(app, "slow", "LOADING")
        t0 = time.monotonic()
        assert (await request).status_code == 504
        load = app.manager.resolve("slow", None).load_task
    assert time.monotonic() - t0 < 30.0, "stop waited for the load instead of cancelling it"
    assert load is not None
    assert load.cancelled(), "the load outlived the manager; its worker was killed under it"
    assert events(app, "load_failed", "slow") == 0
