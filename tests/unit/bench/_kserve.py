"""A tiny KServe v2 REST server for the bench client to load.

It is a test double of *a server*, not of the code under test: the bench is a client, and a
later integration test runs it against the real modelyard server. Models:

- ``add`` (FP32 ``[-1, 4]``), ``ints`` (INT64 ``[2]``), ``text`` (BYTES ``[1]``): answer with
  the sum of their input, after checking names, datatypes and element counts (400 otherwise).
- ``flaky``: always 503 with a v2 error body.
- ``slow``: sleeps ``state.slow_s`` before answering.
- ``loading``: listed by the repository index as LOADING, so discovery must skip it.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

MODELS: dict[str, list[dict[str, Any]]] = {
    "add": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
    "ints": [{"name": "i", "datatype": "INT64", "shape": [2]}],
    "text": [{"name": "t", "datatype": "BYTES", "shape": [1]}],
    "flaky": [{"name": "x", "datatype": "FP32", "shape": [1]}],
    "slow": [{"name": "x", "datatype": "FP32", "shape": [1]}],
    "loading": [{"name": "x", "datatype": "FP32", "shape": [1]}],
}
READY_MODELS = ("add", "ints", "text", "flaky", "slow")


@dataclass
class ServerState:
    """What the double saw, and knobs a test may turn."""

    infer_counts: Counter[str] = field(default_factory=Counter)
    last_body: dict[str, bytes] = field(default_factory=dict)
    slow_s: float = 0.02
    has_repository_index: bool = True


@dataclass
class RunningServer:
    """A started double: its base URL and its state."""

    url: str
    state: ServerState


def build_app(state: ServerState) -> web.Application:
    """The double's routes."""

    async def metadata(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in MODELS:
            return web.json_response({"error": f"model {name} not found"}, status=404)
        body = {
            "name": name,
            "versions": ["1"],
            "platform": "test",
            "inputs": MODELS[name],
            "outputs": [{"name": "sum", "datatype": "FP64", "shape": [1]}],
        }
        return web.json_response(body)

    async def infer(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        raw = await request.read()
        state.infer_counts[name] += 1
        state.last_body[name] = raw
        if name not in MODELS:
            return web.json_response({"error": f"model {name} not found"}, status=404)
        if name == "flaky":
            return web.json_response({"error": "model flaky is not ready"}, status=503)
        if name == "slow":
            await asyncio.sleep(state.slow_s)
        try:
            total = _checked_sum(orjson.loads(raw), MODELS[name])
        except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
            return web.json_response({"error": f"invalid input: {exc}"}, status=400)
        output = {"name": "sum", "datatype": "FP64", "shape": [1], "data": [total]}
        return web.json_response({"model_name": name, "outputs": [output]})

    async def index(request: web.Request) -> web.Response:
        if not state.has_repository_index:
            return web.json_response({"error": "not found"}, status=404)
        entries = [
            {"name": n, "version": "1", "state": "READY" if n in READY_MODELS else "LOADING"}
            for n in MODELS
        ]
        return web.json_response([{**e, "reason": ""} for e in entries])

    async def model_list(request: web.Request) -> web.Response:
        return web.json_response({"models": list(READY_MODELS)})

    app = web.Application()
    app.router.add_get("/v2/models/{name}", metadata)
    app.router.add_post("/v2/models/{name}/infer", infer)
    app.router.add_post("/v2/repository/index", index)
    app.router.add_get("/v2/models", model_list)
    return app


def _checked_sum(body: dict[str, Any], expected: list[dict[str, Any]]) -> float:
    inputs = {item["name"]: item for item in body["inputs"]}
    total = 0.0
    for spec in expected:
        item = inputs[spec["name"]]
        if item["datatype"] != spec["datatype"]:
            raise ValueError(f"datatype {item['datatype']} != {spec['datatype']}")
        if len(item["data"]) != math.prod(item["shape"]):
            raise ValueError("data does not match shape")
        if spec["datatype"] == "BYTES":
            total += sum(len(value) for value in item["data"])
        else:
            total += float(sum(item["data"]))
    return total


async def start_server(state: ServerState) -> tuple[web.AppRunner, str]:
    """Start the double on 127.0.0.1, port 0; returns the runner and the base URL."""
    runner = web.AppRunner(build_app(state), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"
