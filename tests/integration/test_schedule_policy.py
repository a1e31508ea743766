"""Timeouts and priorities on every inference route: REST infer, ``/predict`` and gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.scheduling.scheduler import ModelScheduler
from tests.fakes.fault_models import SLOW
from tests.integration.conftest import python_model
from tests.polling import wait_until
from tests.servers import running_server, write_config

OK = "ok"
DEADLINE = "deadline"
SHORT_MS = 50
"""A client timeout well under the SLOW request's 300 ms."""
ANSWERED_WITHIN_S = 0.25
"""A request that honoured its 50 ms timeout is answered by then (the model takes 0.3 s)."""


@dataclass
class Routes:
    """Sends one request to the ``faulty`` model over a chosen route."""

    client: httpx.AsyncClient
    stub: Any
    scheduler: ModelScheduler

    async def send(
        self,
        route: str,
        value: float,
        *,
        timeout_us: int | None = None,
        header_ms: int | None = None,
        deadline_s: float | None = None,
        priority: int | None = None,
    ) -> str:
        """``ok``, ``deadline`` or the status the route answered with."""
        if route == "grpc":
            return await self._grpc(value, timeout_us, header_ms, deadline_s, priority)
        headers = {} if header_ms is None else {"X-Modelyard-Timeout-Ms": str(header_ms)}
        policy: dict[str, Any] = {}
        if timeout_us is not None:
            policy["timeout"] = timeout_us
        if priority is not None:
            policy["priority"] = priority
        if route == "rest":
            body: dict[str, Any] = {
                "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
                "parameters": policy,
            }
            r = await self.client.post("/v2/models/faulty/infer", json=body, headers=headers)
        else:
            doc = {"model": "faulty", "inputs": {"x": [value]}, **policy}
            r = await self.client.post("/predict", json=doc, headers=headers)
        return {200: OK, 504: DEADLINE}.get(r.status_code, f"{r.status_code}: {r.text}")

    async def _grpc(
        self,
        value: float,
        timeout_us: int | None,
        header_ms: int | None,
        deadline_s: float | None,
        priority: int | None,
    ) -> str:
        request = pb.ModelInferRequest(
            model_name="faulty",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="x",
                    datatype="FP32",
                    shape=[1, 1],
                    contents=pb.InferTensorContents(fp32_contents=[value]),
                )
            ],
        )
        if timeout_us is not None:
            request.parameters["timeout"].int64_param = timeout_us
        if priority is not None:
            request.parameters["priority"].uint64_param = priority
        metadata = () if header_ms is None else (("x-modelyard-timeout-ms", str(header_ms)),)
        try:
            await self.stub.ModelInfer(request, metadata=metadata, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                return DEADLINE
            return f"{exc.code()}: {exc.details()}"
        return OK


@pytest.fixture
async def routes(model_root: Path, tmp_path: Path) -> AsyncIterator[Routes]:
    """``faulty`` (inline, one request at a time) behind REST, ``/predict`` and gRPC."""
    model = python_model(
        "faulty", "FaultyModel", isolation="inline", preload=True, max_batch_size=1
    )
    cfg = write_config(tmp_path, [model], model_repository=str(model_root))
    async with contextlib.AsyncExitStack() as stack:
        app, client = await stack.enter_async_context(running_server(cfg, grpc=True))
        channel = await stack.enter_async_context(
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        )
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated
        scheduler = app.manager.resolve("faulty", None).scheduler
        assert scheduler is not None
        yield Routes(client, stub, scheduler)


TIMEOUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "rest-parameter": ("rest", {"timeout_us": SHORT_MS * 1000}),
    "rest-header": ("rest", {"header_ms": SHORT_MS}),
    "predict-body": ("predict", {"timeout_us": SHORT_MS * 1000}),
    "predict-header": ("predict", {"header_ms": SHORT_MS}),
    "grpc-parameter": ("grpc", {"timeout_us": SHORT_MS * 1000}),
    "grpc-metadata": ("grpc", {"header_ms": SHORT_MS}),
}


@pytest.mark.parametrize("case", list(TIMEOUTS), ids=list(TIMEOUTS))
async def test_every_route_honours_the_clients_timeout(routes: Routes, case: str) -> None:
    route, policy = TIMEOUTS[case]
    t0 = time.monotonic()
    # The client sets no deadline of its own here: a quick "deadline exceeded" is the server's.
    assert await routes.send(route, SLOW, **policy) == DEADLINE
    assert time.monotonic() - t0 < ANSWERED_WITHIN_S
    # The server keeps serving on that route. Without the short timeout: this request
    # checks that the route still serves, not how fast (under load, a 50 ms budget for a
    # whole round trip behind the still-running slow call is what made this test flaky).
    assert await routes.send(route, 0.5) == OK


async def test_grpc_honours_its_own_deadline(routes: Routes) -> None:
    assert await routes.send("grpc", SLOW, deadline_s=SHORT_MS / 1000) == DEADLINE

    # The server gave up too (its deadline or the RPC's cancellation), rather than
    # finishing work nobody waits for.
    def gave_up() -> bool:
        counters = routes.scheduler.counters
        return bool(
            counters["expired_running"] + counters["expired_queued"] + counters["cancelled"]
        )

    await wait_until(gave_up, timeout_s=5.0, what="the server gives the call up")
    counters = routes.scheduler.counters
    assert counters["succeeded"] == 0, counters
    assert await routes.send("grpc", 0.5, deadline_s=5.0) == OK


@pytest.mark.parametrize("route", ["rest", "predict", "grpc"])
async def test_every_route_honours_priority(routes: Routes, route: str) -> None:
    order: list[str] = []

    async def send(tag: str, priority: int) -> None:
        assert await routes.send(route, SLOW, priority=priority) == OK
        order.append(tag)

    blocker = asyncio.create_task(send("blocker", 1))
    await wait_until(lambda: routes.scheduler.pending == 1, what="the blocker runs")
    tasks = [asyncio.create_task(send(f"low{i}", 5)) for i in range(2)]
    await wait_until(lambda: routes.scheduler.pending == 3, what="both low requests are queued")
    tasks += [asyncio.create_task(send(f"high{i}", 1)) for i in range(2)]
    await asyncio.gather(blocker, *tasks)
    assert order[0] == "blocker"
    assert sorted(order[1:3]) == ["high0", "high1"], order
