"""What every runtime's server test does: a real server, v2 infer over HTTP, and the
stock ``tritonclient`` metadata call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.http as triton

from modelyard.app import App
from modelyard.protocol.datatypes import v2_datatype
from modelyard.runtimes import RuntimeSpec, create_runtime
from modelyard.runtimes.base import Runtime
from tests.servers import running_server, write_config


def load_inline(kind: str, version_dir: Path, **fields: Any) -> Runtime:
    """A runtime of ``kind`` loaded in this process (for comparisons with the library)."""
    runtime = create_runtime(kind)
    runtime.load(RuntimeSpec(kind=kind, version_dir=str(version_dir), **fields))
    return runtime


@contextlib.asynccontextmanager
async def serving(
    root: Path, models: Sequence[dict[str, Any]], config_dir: Path
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    """A real server over the repository ``root`` with ``models`` (worker processes)."""
    cfg = write_config(config_dir, models, model_repository=str(root))
    async with running_server(cfg) as served:
        yield served


def tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    """A v2 JSON input tensor."""
    data = array.reshape(-1).tolist()
    if array.dtype == object:
        data = [v.decode() if isinstance(v, bytes) else v for v in data]
    datatype = v2_datatype(array.dtype)
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


async def infer(
    client: httpx.AsyncClient, model: str, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """POST a v2 infer request; every output as a numpy array of its shape."""
    body = {"inputs": [tensor(k, v) for k, v in inputs.items()]}
    r = await client.post(f"/v2/models/{model}/infer", json=body)
    assert r.status_code == 200, r.text
    return {out["name"]: np.array(out["data"]).reshape(out["shape"]) for out in r.json()["outputs"]}


async def triton_metadata(app: App, model: str) -> dict[str, Any]:
    """``get_model_metadata`` from the stock tritonclient, as a user would call it."""
    assert app.http_port is not None

    def call() -> dict[str, Any]:
        client = triton.InferenceServerClient(f"127.0.0.1:{app.http_port}")
        try:
            meta: dict[str, Any] = client.get_model_metadata(model)
            return meta
        finally:
            client.close()

    return await asyncio.to_thread(call)


def tensors_of(meta: dict[str, Any], side: str) -> list[tuple[str, str, list[int]]]:
    """``(name, datatype, shape)`` of each tensor in metadata's ``inputs`` or ``outputs``."""
    return [(t["name"], t["datatype"], list(t["shape"])) for t in meta[side]]
