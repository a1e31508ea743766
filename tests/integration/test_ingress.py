"""``ingress_processes: 2``: two HTTP processes in front of one manager, on a real server.

One server (process isolation, tokens on both planes) is started with two ingress
processes. Requests on fresh connections are answered by both (the
``x-modelyard-ingress`` header names the process), and every guarantee of the single-
process server holds through them: tokens, typed errors with their status, body
limits, deadlines, readiness, one model table for loads, metrics of both ingresses at
one ``/metrics``. An ingress killed with SIGKILL is replaced and the server keeps
serving, the connections waiting for it included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
import pytest_asyncio

from modelyard.app import App, StartupError
from modelyard.config.settings import load_settings
from tests.integration.conftest import python_model
from tests.polling import wait_until
from tests.security._pki import client_context, make_pki
from tests.security.test_auth import (
    DATA,
    MANAGEMENT,
    REST_CALLS,
    WRONG,
    _assert_refused,
    _good_infer,
    _rest,
)
from tests.servers import running_server, started_app, write_config

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]

INFER_BODY = {
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]
}
ADDED = [2.0, 3.0, 4.0, 5.0]
"""What ``add`` version 2 answers to INFER_BODY."""
INGRESS_HEADER = "x-modelyard-ingress"
MAX_REQUEST_BYTES = 64 * 1024


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(
    model_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    models = [
        {"name": "add", "path": "add", "preload": True, "isolation": "process"},
        python_model("faulty", "FaultyModel", preload=True, max_batch_size=1),
    ]
    cfg = write_config(
        tmp_path_factory.mktemp("ingress"),
        models,
        model_repository=str(model_root),
        ingress_processes=2,
        max_request_mb=MAX_REQUEST_BYTES / (1024 * 1024),
        security={"management_token": MANAGEMENT, "data_token": DATA, "protect_metrics": True},
    )
    async with running_server(cfg) as (app, client):
        client.headers.update(bearer(MANAGEMENT))
        yield app, client


def ingress_pids() -> set[int]:
    """The ingress processes of this test process's servers."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if "modelyard.frontends.ingress.child" in child.cmdline():
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


async def fresh_infer(app: App) -> httpx.Response:
    """One infer on a new connection (the kernel picks the ingress per connection)."""
    url = f"http://127.0.0.1:{app.http_port}"
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=bearer(DATA)) as c:
        return await c.post("/v2/models/add/infer", json=INFER_BODY)


async def test_both_ingress_processes_serve_infer(served: tuple[App, httpx.AsyncClient]) -> None:
    app, client = served
    pids = ingress_pids()
    assert len(pids) == 2
    assert os.getpid() not in pids
    seen = set()
    for _ in range(24):
        r = await fresh_infer(app)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == ADDED
        seen.add(int(r.headers[INGRESS_HEADER]))
    assert seen == pids
    # Both ingresses' requests are counted at the one /metrics, with the model's own.
    metrics = (await client.get("/metrics")).text
    for pid in pids:
        assert f'modelyard_ingress_requests_total{{ingress="{pid}"}}' in metrics
    assert 'model="add"' in metrics


async def test_errors_keep_their_status_through_an_ingress(
    served: tuple[App, httpx.AsyncClient],
) -> None:
    app, client = served
    r = await client.post("/v2/models/nope/infer", json=INFER_BODY)
    assert r.status_code == 404, r.text
    assert "nope" in r.json()["error"]
    assert INGRESS_HEADER in r.headers
    r = await client.post(
        "/v2/models/add/infer", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    r = await client.post("/v2/models/add/infer", content=b"x" * (MAX_REQUEST_BYTES + 1))
    assert r.status_code == 413, r.text
    # A body over the limit sent in chunks (no content-length) is refused as well.

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b" " * (MAX_REQUEST_BYTES // 4)

    r = await client.post("/v2/models/add/infer", content=chunks())
    assert r.status_code == 413, r.text
    # The deadline header holds: the faulty model sleeps 0.3 s on x == 4.
    slow = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [4]}]}
    r = await client.post(
        "/v2/models/faulty/infer", json=slow, headers={"x-modelyard-timeout-ms": "50"}
    )
    assert r.status_code == 504, r.text
    assert (await fresh_infer(app)).status_code == 200


async def test_a_client_that_leaves_has_its_queued_request_removed(
    served: tuple[App, httpx.AsyncClient],
) -> None:
    """The ingress relays the client's disconnect, so a queued request leaves its queue."""
    app, client = served
    scheduler = app.manager.resolve("faulty", None).scheduler
    assert scheduler is not None
    await wait_until(lambda: scheduler.pending == 0, what="earlier requests are done")
    cancelled, calls = scheduler.counters["cancelled"], scheduler.counters["model_calls"]
    slow = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [4]}]}
    blocker = asyncio.create_task(client.post("/v2/models/faulty/infer", json=slow))
    await wait_until(lambda: scheduler.pending == 1, what="the blocker runs")
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v2/models/faulty/infer", json=slow, timeout=0.1)
    assert (await blocker).status_code == 200
    await wait_until(lambda: scheduler.counters["cancelled"] > cancelled, timeout_s=10.0)
    assert scheduler.counters["cancelled"] == cancelled + 1
    assert scheduler.counters["model_calls"] == calls + 1, "the cancelled request never ran"


async def test_tokens_are_checked_through_an_ingress(
    served: tuple[App, httpx.AsyncClient],
) -> None:
    app, _ = served
    url = f"http://127.0.0.1:{app.http_port}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as anonymous:
        r = await anonymous.post("/v2/models/add/infer", json=INFER_BODY)
        assert r.status_code == 401, r.text
        r = await anonymous.post("/v2/repository/models/add/unload", json={})
        assert r.status_code == 401, r.text
        r = await anonymous.post("/v2/repository/models/add/unload", json={}, headers=bearer(DATA))
        assert r.status_code == 403, r.text
        # Readiness is open, and it is the manager's.
        r = await anonymous.get("/v2/health/ready")
        assert r.status_code == 200, r.text
    assert (await fresh_infer(app)).status_code == 200


async def test_every_route_checks_its_token_through_an_ingress(
    served: tuple[App, httpx.AsyncClient],
) -> None:
    """The security suite's REST route table, each route through the ingress processes."""
    app, _ = served
    url = f"http://127.0.0.1:{app.http_port}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for name, call in REST_CALLS.items():
            if call.plane == "open":
                for token in (None, WRONG):
                    r = await _rest(client, call, token)
                    assert r.status_code == 200, (name, token, r.text)
                continue
            _assert_refused(await _rest(client, call, None), 401)
            _assert_refused(await _rest(client, call, WRONG), 403)
            granted = [MANAGEMENT] if call.plane == "management" else [DATA, MANAGEMENT]
            for token in granted:
                r = await _rest(client, call, token)
                assert r.status_code == 200, (name, token[:4], r.text)
            if call.plane == "management":
                _assert_refused(await _rest(client, call, DATA), 403)
            await _good_infer(client)


async def test_one_model_table_behind_every_ingress(
    served: tuple[App, httpx.AsyncClient],
) -> None:
    app, client = served
    r = await client.post("/v2/repository/models/mlp/load", json={})
    assert r.status_code == 200, r.text
    # Loaded once, in the manager: every ingress now sees it ready.
    assert any(rec.key.name == "mlp" and rec.is_ready for rec in app.manager.records())
    url = f"http://127.0.0.1:{app.http_port}"
    seen = set()
    for _ in range(12):
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=bearer(DATA)) as c:
            r = await c.get("/v2/models/mlp/ready")
            assert r.status_code == 200, r.text
            seen.add(r.headers[INGRESS_HEADER])
    assert len(seen) == 2
    r = await client.post("/v2/repository/models/mlp/unload", json={})
    assert r.status_code == 200, r.text


async def test_a_killed_ingress_is_replaced(served: tuple[App, httpx.AsyncClient]) -> None:
    app, client = served
    before = ingress_pids()
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    # Requests keep being answered, those sent to the victim's socket while its
    # replacement starts included (they wait in the socket's backlog).
    answers = await asyncio.gather(*(fresh_infer(app) for _ in range(12)))
    assert [r.status_code for r in answers] == [200] * 12
    for _ in range(600):
        after = ingress_pids()
        if len(after) == 2 and victim not in after:
            break
        await asyncio.sleep(0.05)
    assert len(after) == 2
    assert victim not in after
    seen = set()
    for _ in range(24):
        r = await fresh_infer(app)
        assert r.status_code == 200, r.text
        seen.add(int(r.headers[INGRESS_HEADER]))
    assert seen == after
    metrics = (await client.get("/metrics")).text
    assert "modelyard_ingress_restarts_total 1.0" in metrics


async def test_mutual_tls_through_ingress_processes(model_root: Path, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    security = {
        "tls_certfile": "cert.pem",
        "tls_keyfile": "key.pem",
        "tls_client_ca_file": str(pki.ca_file),
    }
    models = [{"name": "add", "path": "add", "preload": True, "isolation": "inline"}]
    cfg = write_config(
        tmp_path, models, model_repository=str(model_root), security=security, ingress_processes=2
    )
    async with started_app(cfg) as app:
        url = f"https://127.0.0.1:{app.http_port}"
        async with httpx.AsyncClient(
            base_url=url, verify=client_context(pki, with_cert=False), timeout=10
        ) as anonymous:
            with pytest.raises(httpx.TransportError):
                await anonymous.get("/v2/health/ready")
        async with httpx.AsyncClient(
            base_url=url, verify=client_context(pki, with_cert=True), timeout=10
        ) as client:
            r = await client.post("/v2/models/add/infer", json=INFER_BODY)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == ADDED
            assert INGRESS_HEADER in r.headers


async def test_a_port_in_use_stops_the_start(model_root: Path, tmp_path: Path) -> None:
    models = [{"name": "add", "path": "add", "isolation": "inline"}]
    cfg = write_config(tmp_path, models, model_repository=str(model_root), ingress_processes=2)
    before = ingress_pids()  # another test's server may be running
    for reuse_port in (False, True):
        # Another server on the port, with or without SO_REUSEPORT: never shared.
        with socket.socket() as other:
            if reuse_port:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            other.bind(("127.0.0.1", 0))
            other.listen()
            port = other.getsockname()[1]
            app = App(load_settings(cfg, host="127.0.0.1", http_port=port, grpc_port=0))
            with pytest.raises(StartupError, match="cannot serve HTTP"):
                await app.start()
            assert ingress_pids() == before
