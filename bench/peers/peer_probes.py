"""What the harness asks a server over HTTP: readiness, one inference, a timed cold start."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from peer_servers import RunningServer

POLL_S = 0.25


class ProbeError(RuntimeError):
    """A server did not answer as the benchmark needs."""


def wait_ready(
    server: RunningServer, client: httpx.Client, models: Sequence[str], timeout_s: float
) -> float:
    """Poll until the server and every model in ``models`` answer ready; return seconds taken.

    Server readiness alone is not enough: PyTriton is ready before it has bound any model, and
    modelyard stays ready when a model failed to load.
    """
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while time.monotonic() < deadline:
        code = server.exit_code()
        if code is not None:
            raise ProbeError(f"{server.spec.name} exited ({code}):\n{server.log_tail()}")
        try:
            if client.get("/v2/health/ready").status_code == 200:
                pending = [m for m in pending if not _model_ready(client, m)]
                if not pending:
                    return time.monotonic() - server.started_at
                failed = _failed_models(server, client, pending)
                if failed:
                    raise ProbeError(f"{server.spec.name}: models failed to load: {failed}")
        except httpx.TransportError:
            pass
        time.sleep(POLL_S)
    raise ProbeError(
        f"{server.spec.name} not ready after {timeout_s:.0f} s (waiting for {pending}):\n"
        f"{server.log_tail()}"
    )


def _failed_models(
    server: RunningServer, client: httpx.Client, models: Sequence[str]
) -> dict[str, str]:
    """Models the repository index reports FAILED (modelyard does), with the reason given."""
    headers = {"Content-Type": "application/json", **server.spec.repository_headers}
    response = client.post("/v2/repository/index", content=b"{}", headers=headers)
    if response.status_code != 200 or not isinstance(body := response.json(), list):
        return {}
    return {
        str(entry.get("name")): str(entry.get("reason", ""))
        for entry in body
        if isinstance(entry, dict)
        and entry.get("name") in models
        and str(entry.get("state", "")).upper() == "FAILED"
    }


def _model_ready(client: httpx.Client, model: str) -> bool:
    return client.get(f"/v2/models/{quote(model, safe='')}/ready").status_code == 200


def infer(client: httpx.Client, model: str, body: bytes) -> dict[str, Any]:
    """One inference with ``body``; returns the response or raises :class:`ProbeError`."""
    response = client.post(
        f"/v2/models/{quote(model, safe='')}/infer",
        content=body,
        headers={"Content-Type": "application/json"},
    )
    if response.status_code != 200:
        raise ProbeError(f"infer {model}: HTTP {response.status_code} {response.text[:300]}")
    result: dict[str, Any] = response.json()
    return result


def predicted_label(response: Mapping[str, Any]) -> int | None:
    """The first integer output's first value: ``label`` (ONNX, Triton), ``predict`` (MLServer)."""
    for output in response.get("outputs", []):
        if str(output.get("datatype", "")).upper().startswith(("INT", "UINT")):
            data = output.get("data") or []
            while isinstance(data, list) and data and isinstance(data[0], list):
                data = data[0]
            return int(data[0]) if data else None
    return None


def cold_start(
    server: RunningServer,
    client: httpx.Client,
    model: str,
    body: bytes,
    *,
    repeats: int,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Unload ``model``, then time ``load`` plus the first inference; ``repeats`` times.

    Returns the median and every sample of the total, and of its two parts.
    """
    headers = {"Content-Type": "application/json", **server.spec.repository_headers}
    base = f"/v2/repository/models/{quote(model, safe='')}"
    totals: list[float] = []
    loads: list[float] = []
    firsts: list[float] = []
    for _ in range(repeats):
        response = client.post(f"{base}/unload", content=b"{}", headers=headers)
        if response.status_code != 200:
            raise ProbeError(f"unload {model}: HTTP {response.status_code} {response.text[:300]}")
        _wait_unready(client, model, timeout_s)
        started = time.perf_counter()
        response = client.post(f"{base}/load", content=b"{}", headers=headers, timeout=timeout_s)
        loaded = time.perf_counter()
        if response.status_code != 200:
            raise ProbeError(f"load {model}: HTTP {response.status_code} {response.text[:300]}")
        infer(client, model, body)
        done = time.perf_counter()
        totals.append(done - started)
        loads.append(loaded - started)
        firsts.append(done - loaded)
    return {
        "model": model,
        "method": "POST unload; then time POST load + first infer",
        "median_s": round(statistics.median(totals), 4),
        "load_median_s": round(statistics.median(loads), 4),
        "first_infer_median_s": round(statistics.median(firsts), 4),
        "samples_s": [round(t, 4) for t in totals],
    }


def _wait_unready(client: httpx.Client, model: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _model_ready(client, model):
            return
        time.sleep(0.05)
    raise ProbeError(f"{model} still ready {timeout_s:.0f} s after unload")


def write_payloads(folder: Path, models: Sequence[str], row: Sequence[float]) -> dict[str, Path]:
    """One v2 request body per model (input ``input`` FP32 ``[1, 64]``), identical bytes."""
    folder.mkdir(parents=True, exist_ok=True)
    body = json.dumps(
        {
            "inputs": [
                {"name": "input", "shape": [1, len(row)], "datatype": "FP32", "data": list(row)}
            ]
        }
    )
    paths = {}
    for model in models:
        path = folder / f"{model}.json"
        path.write_text(body + "\n")
        paths[model] = path
    return paths
