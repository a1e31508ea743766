"""Poll mode over time: refused versions are offered again, the default route survives."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from modelyard.app import App
from modelyard.examples.mlp import build_add_onnx
from modelyard.repository.manifest import write_manifest
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}

pytestmark = pytest.mark.slow  # each test waits for several poll rounds (2-6 s)


def _poll_config(tmp_path: Path) -> tuple[Path, Path]:
    """``add`` version 1 (+1, with a manifest), preloaded, in a repository polled fast."""
    root = tmp_path / "repo"
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    write_manifest(root / "add" / "1")
    models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(root),
        model_control_mode="poll",
        poll_interval_s=0.1,
        poll_settle_s=0.2,
    )
    return root, cfg


def _corrupt_version(staging: Path, value: float) -> Path:
    """A version folder whose manifest does not match its model file (one byte flipped)."""
    build_add_onnx(staging / "model.onnx", value)
    write_manifest(staging)
    data = bytearray((staging / "model.onnx").read_bytes())
    data[-5] ^= 0x01
    (staging / "model.onnx").write_bytes(bytes(data))
    return staging


async def _value(client: httpx.AsyncClient) -> float:
    r = await client.post("/v2/models/add/infer", json=BODY)
    assert r.status_code == 200, r.text
    return float(r.json()["outputs"][0]["data"][0])


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 8.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _state(app: App, version: str) -> str | None:
    record = app.manager.entry("add").versions.get(version)
    return None if record is None else record.state.value


async def test_poll_mode_offers_a_refused_version_again_once_its_files_are_replaced(
    tmp_path: Path,
) -> None:
    root, cfg = _poll_config(tmp_path)
    async with running_server(cfg) as (app, client):
        assert await _value(client) == 1.0
        shutil.copytree(_corrupt_version(tmp_path / "staging", 2.0), root / "add" / "2")

        async def refused() -> bool:
            return _state(app, "2") == "FAILED"

        await _until(refused, "version 2 to be refused")
        assert await _value(client) == 1.0
        # The writer replaces the broken files under the same version number.
        shutil.rmtree(root / "add" / "2")
        build_add_onnx(tmp_path / "fixed" / "model.onnx", 2.0)
        write_manifest(tmp_path / "fixed")
        shutil.copytree(tmp_path / "fixed", root / "add" / "2")

        async def switched() -> bool:
            return await _value(client) == 2.0

        await _until(switched, "the fixed version 2 to be verified, loaded and switched to")
        aliases = (await client.get("/v2/repository/models/add/aliases")).json()["aliases"]
        assert aliases["default"] == {"2": 1.0}


async def test_poll_mode_takes_a_slow_writers_version_once_it_is_complete(
    tmp_path: Path,
) -> None:
    root, cfg = _poll_config(tmp_path)
    async with running_server(cfg) as (app, client):
        assert await _value(client) == 1.0
        # Half a model file and no manifest: it settles, is taken, and fails to load.
        build_add_onnx(tmp_path / "whole" / "model.onnx", 2.0)
        whole = (tmp_path / "whole" / "model.onnx").read_bytes()
        (root / "add" / "2").mkdir()
        (root / "add" / "2" / "model.onnx").write_bytes(whole[: len(whole) // 2])

        async def refused() -> bool:
            return _state(app, "2") == "FAILED"

        await _until(refused, "the half-written version 2 to be refused")
        assert await _value(client) == 1.0
        (root / "add" / "2" / "model.onnx").write_bytes(whole)

        async def switched() -> bool:
            return await _value(client) == 2.0

        await _until(switched, "the completed version 2 to be loaded and switched to")


async def test_poll_mode_keeps_a_default_route_after_a_version_is_removed_and_restored(
    tmp_path: Path,
) -> None:
    root, cfg = _poll_config(tmp_path)
    async with running_server(cfg) as (app, client):
        assert await _value(client) == 1.0
        saved = tmp_path / "saved"
        shutil.copytree(root / "add" / "1", saved)
        shutil.rmtree(root / "add" / "1")

        async def removed() -> bool:
            return "1" not in app.manager.entry("add").versions

        await _until(removed, "version 1 to be removed")
        r = await client.post("/v2/models/add/infer", json=BODY)
        assert r.status_code in (404, 503), r.text
        assert "add" in r.json()["error"]
        # Restored as it was (copytree keeps names, sizes and mtimes).
        shutil.copytree(saved, root / "add" / "1")

        async def serving() -> bool:
            r = await client.post("/v2/models/add/infer", json=BODY)
            return r.status_code == 200

        await _until(serving, "the restored version 1 to serve again")
        assert await _value(client) == 1.0
        shutil.copytree(_corrupt_version(tmp_path / "staging", 2.0), root / "add" / "2")
        for _ in range(80):
            await asyncio.sleep(0.1)
            assert await _value(client) == 1.0, "version 1 keeps serving unversioned requests"
            if _state(app, "2") == "FAILED":
                break
        assert _state(app, "2") == "FAILED", "the corrupt version 2 was never tried"
        assert _state(app, "1") == "READY"
        aliases = (await client.get("/v2/repository/models/add/aliases")).json()["aliases"]
        assert aliases["default"] == {"1": 1.0}
