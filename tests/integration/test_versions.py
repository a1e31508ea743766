"""Versions: blue-green switch under load, corrupt versions refused, rollback, polling."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import httpx
import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.repository.manifest import MANIFEST_NAME, verify_manifest, write_manifest
from tests.polling import wait_until
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


def _repo(tmp_path: Path, versions: dict[int, float], *, manifests: bool = True) -> Path:
    root = tmp_path / "repo"
    for v, value in versions.items():
        vdir = root / "add" / str(v)
        build_add_onnx(vdir / "model.onnx", value)
        if manifests:
            write_manifest(vdir)
    return root


async def _value(client: httpx.AsyncClient, path: str = "/v2/models/add/infer") -> float:
    r = await client.post(path, json=BODY)
    assert r.status_code == 200, r.text
    data = r.json()["outputs"][0]["data"]
    assert len(set(data)) == 1, f"a response mixing versions: {data}"
    return float(data[0])


@pytest.fixture
def two_versions(tmp_path: Path) -> Path:
    """``add`` v1 (+1) and v2 (+2), both served, v1 the default, with manifests."""
    root = _repo(tmp_path, {1: 1.0, 2: 2.0})
    model = {
        "name": "add",
        "path": "add",
        "isolation": "inline",
        "default_version": "1",
        "version_policy": {"all": True},
        "preload": True,
    }
    return write_config(tmp_path, [model], model_repository=str(root))


async def test_blue_green_switch_under_load_loses_nothing(two_versions: Path) -> None:
    cfg = two_versions
    async with running_server(cfg) as (app, client):
        seen: list[float] = []
        failures: list[str] = []
        stop = asyncio.Event()

        async def load_client() -> None:
            while not stop.is_set():
                r = await client.post("/v2/models/add/infer", json=BODY)
                if r.status_code != 200:
                    failures.append(r.text)
                    continue
                data = r.json()["outputs"][0]["data"]
                if len(set(data)) != 1:
                    failures.append(f"mixed {data}")
                seen.append(data[0])

        clients = [asyncio.create_task(load_client()) for _ in range(6)]
        await wait_until(lambda: len(seen) >= 20, 30.0, what="version 1 serving under load")
        r = await client.post("/v2/repository/models/add/aliases/default", json={"version": "2"})
        assert r.status_code == 200, r.text
        switched = len(seen)
        await wait_until(lambda: len(seen) >= switched + 20, 30.0, what="answers after the switch")
        stop.set()
        await asyncio.gather(*clients)
        assert failures == []
        assert set(seen) == {1.0, 2.0}
        # Once switched, never back: every 2.0 comes after the last 1.0.
        last_one = max(i for i, v in enumerate(seen) if v == 1.0)
        assert all(v == 2.0 for v in seen[last_one + 1 :])
        assert await _value(client) == 2.0
        # The old version stays loaded for instant rollback.
        assert app.manager.resolve("add", "1").is_ready


async def test_rollback_answers_from_previous_version_at_once(two_versions: Path) -> None:
    cfg = two_versions
    async with running_server(cfg) as (_, client):
        assert await _value(client) == 1.0
        r = await client.post("/v2/repository/models/add/aliases/default", json={"version": "2"})
        assert r.status_code == 200
        assert await _value(client) == 2.0
        r = await client.post("/v2/repository/models/add/rollback", json={})
        assert r.status_code == 200, r.text
        assert r.json()["versions"] == {"1": 1.0}
        assert await _value(client) == 1.0
        r = await client.post("/v2/repository/models/add/rollback", json={})
        assert r.status_code == 409, "nothing left to roll back to"


async def test_named_alias_and_weighted_canary(tmp_path: Path) -> None:
    root = _repo(tmp_path, {1: 1.0, 2: 2.0})
    models = [
        {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}}
    ]
    cfg = write_config(tmp_path, models, model_repository=str(root))
    async with running_server(cfg) as (_, client):
        r = await client.post("/v2/repository/models/add/aliases/stable", json={"version": 1})
        assert r.status_code == 200, r.text
        assert await _value(client, "/v2/models/add/versions/stable/infer") == 1.0
        r = await client.post(
            "/v2/repository/models/add/aliases/canary", json={"versions": {"1": 50, "2": 50}}
        )
        assert r.status_code == 200
        values = [await _value(client, "/v2/models/add/versions/canary/infer") for _ in range(60)]
        assert {1.0, 2.0} == set(values)
        aliases = (await client.get("/v2/repository/models/add/aliases")).json()["aliases"]
        assert aliases["stable"] == {"1": 1.0}
        assert aliases["canary"] == {"1": 50.0, "2": 50.0}


def test_manifest_names_file_and_digests(tmp_path: Path) -> None:
    root = _repo(tmp_path, {1: 1.0})
    vdir = root / "add" / "1"
    assert verify_manifest(vdir)
    data = bytearray((vdir / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (vdir / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(
        Exception, match=r"model.onnx has SHA256 [0-9a-f]{64}, manifest expects [0-9a-f]{64}"
    ):
        verify_manifest(vdir)


def test_signed_manifest(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from modelyard.repository.manifest import load_public_key

    key = Ed25519PrivateKey.generate()
    key_file = tmp_path / "key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    root = _repo(tmp_path, {1: 1.0}, manifests=False)
    vdir = root / "add" / "1"
    write_manifest(vdir, key_file)
    assert verify_manifest(vdir, public_keys=[load_public_key(pub)])
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(Exception, match="signature does not match"):
        verify_manifest(vdir, public_keys=[other])


async def test_poll_mode_refuses_corrupt_version_and_takes_good_one(tmp_path: Path) -> None:
    root = _repo(tmp_path, {1: 1.0})
    models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(root),
        model_control_mode="poll",
        poll_interval_s=0.1,
        poll_settle_s=0.2,
    )
    async with running_server(cfg) as (app, client):
        assert await _value(client) == 1.0
        # A corrupt version 2: built, manifested, then one byte flipped.
        staging = tmp_path / "staging2"
        build_add_onnx(staging / "model.onnx", 2.0)
        write_manifest(staging)
        data = bytearray((staging / "model.onnx").read_bytes())
        data[-5] ^= 0x01
        (staging / "model.onnx").write_bytes(bytes(data))
        shutil.copytree(staging, root / "add" / "2")
        for _ in range(50):
            await asyncio.sleep(0.1)
            assert await _value(client) == 1.0, "the previous version serves throughout"
            record = app.manager.entry("add").versions.get("2")
            if record is not None and record.state.value == "FAILED":
                break
        index = (await client.post("/v2/repository/index", json={})).json()
        row = next(r for r in index if r["version"] == "2")
        assert row["state"] == "FAILED"
        assert "SHA256" in row["reason"]
        assert "manifest expects" in row["reason"]
        events = (await client.get("/v2/stats")).json()["events"]
        assert any(e["kind"] == "verify_failed" and e["version"] == "2" for e in events)
        # A good version 3 (no manifest: taken once settled) is loaded and switched to.
        build_add_onnx(root / "add" / "3" / "model.onnx", 3.0)
        for _ in range(60):
            await asyncio.sleep(0.1)
            if await _value(client) == 3.0:
                break
        assert await _value(client) == 3.0
        # Removing it drains, unloads and falls back.
        shutil.rmtree(root / "add" / "3")
        for _ in range(60):
            await asyncio.sleep(0.1)
            if "3" not in app.manager.entry("add").versions:
                break
        assert await _value(client) in (1.0,)
        assert MANIFEST_NAME
