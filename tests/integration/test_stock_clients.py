"""A stock client of the protocol, unchanged: NVIDIA's ``tritonclient.http``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.servers import running_server, write_config


def _session(port: int) -> dict[str, Any]:
    """What a user of tritonclient does, end to end (synchronous client)."""
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    seen: dict[str, Any] = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "metadata": client.get_model_metadata("add"),
    }
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for binary in (True, False):
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        wanted = triton.InferRequestedOutput("output", binary_data=binary)
        result = client.infer("add", [tensor], outputs=[wanted], model_version="1")
        seen[f"infer-binary-{binary}"] = result.as_numpy("output")
    client.unload_model("add")
    seen["ready-after-unload"] = client.is_model_ready("add")
    client.load_model("add")
    seen["ready-after-load"] = client.is_model_ready("add")
    seen["index"] = {(m["name"], m["state"]) for m in client.get_model_repository_index()}
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [tensor])
    seen["unknown-model"] = (info.value.status(), info.value.message())
    client.close()
    return seen


async def test_tritonclient_http_works_unchanged(model_root: Path, tmp_path: Path) -> None:
    models = [{"name": "add", "path": "add", "version_policy": {"all": True}, "preload": True}]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    async with running_server(cfg) as (app, _):
        assert app.http_port is not None
        seen = await asyncio.to_thread(_session, app.http_port)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert seen["live"] is True
    assert seen["ready"] is True
    meta = seen["metadata"]
    assert isinstance(meta, dict)
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    np.testing.assert_array_equal(seen["infer-binary-True"], x + 1.0)
    np.testing.assert_array_equal(seen["infer-binary-False"], x + 1.0)
    assert seen["ready-after-unload"] is False
    assert seen["ready-after-load"] is True
    assert ("add", "READY") in seen["index"]
    status, message = seen["unknown-model"]
    assert status == "404"
    assert "'nope' is not in the repository" in message
