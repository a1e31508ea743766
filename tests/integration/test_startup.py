"""Start-up: broken model entries are reported (file, field, reason), never dropped silently."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from modelyard.app import App, StartupError
from modelyard.config.settings import load_settings
from modelyard.examples.mlp import build_add_onnx
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


def _row(index: list[dict[str, str]], name: str) -> dict[str, str]:
    return next(r for r in index if r["name"] == name)


async def test_a_path_naming_one_model_file_serves_that_file_as_version_1(tmp_path: Path) -> None:
    # Two ONNX files side by side: the one the path names is the one loaded.
    build_add_onnx(tmp_path / "repo" / "pair" / "model.onnx", 1.0)
    build_add_onnx(tmp_path / "repo" / "pair" / "plus-two.onnx", 2.0)
    models = [{"name": "single", "path": "pair/plus-two.onnx", "preload": True}]
    cfg = write_config(tmp_path, models, model_repository=str(tmp_path / "repo"))
    async with running_server(cfg) as (_, client):
        index = (await client.post("/v2/repository/index", json={})).json()
        assert _row(index, "single") == {
            "name": "single",
            "version": "1",
            "state": "READY",
            "reason": "",
        }
        for path in ("/v2/models/single/infer", "/v2/models/single/versions/1/infer"):
            r = await client.post(path, json=BODY)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == [2.0] * 4


async def test_broken_model_entries_are_reported_at_start_with_file_field_and_reason(
    model_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "empty").mkdir()
    models = [
        {"name": "add", "path": "add", "isolation": "inline"},
        {"name": "missing", "path": "no/such/folder", "isolation": "inline"},
        {"name": "empty", "path": str(tmp_path / "empty"), "isolation": "inline"},
        {"name": "unlisted", "path": "add", "version_policy": {"specific": [7]}},
        {"name": "wrong-default", "path": "add", "default_version": "5", "isolation": "inline"},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    with caplog.at_level(logging.ERROR, logger="modelyard"):
        async with running_server(cfg) as (_, client):
            index = (await client.post("/v2/repository/index", json={})).json()
            missing = _row(index, "missing")
            assert missing["state"] == "FAILED"
            assert "does not exist" in missing["reason"]
            assert "no version folders" in _row(index, "empty")["reason"]
            assert "version_policy" in _row(index, "unlisted")["reason"]
            r = await client.post("/v2/models/missing/infer", json=BODY)
            assert r.status_code == 404, r.text
            assert "does not exist" in r.json()["error"]
            r = await client.post("/v2/models/wrong-default/infer", json=BODY)
            assert r.status_code == 404, "not another version than the one configured"
            assert "'5'" in r.json()["error"]
            r = await client.post("/v2/models/add/infer", json=BODY)
            assert r.status_code == 200, "the good model serves beside the broken ones"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    for field, reason in [
        ("models[1].path", "does not exist"),
        ("models[2].path", "no version folders"),
        ("models[3].path", "version_policy"),
        ("models[4].default_version", "no version folder '5'"),
    ]:
        assert any(str(cfg) in e and field in e and reason in e for e in errors), (field, errors)


async def test_a_preloaded_model_that_cannot_load_fails_the_start(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "add", "path": "add", "isolation": "inline", "preload": True},
        {"name": "corrupt", "path": "corrupt", "isolation": "inline", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    with pytest.raises(StartupError, match=r"models\[1\].*corrupt:1.*failed to load") as info:
        async with running_server(cfg):
            pytest.fail("the server started although a preloaded model cannot load")
    assert "exit_on_error" in str(info.value)


async def test_a_preloaded_model_without_versions_fails_the_start(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "missing", "path": "gone", "preload": True},
        {"name": "wrong-default", "path": "add", "default_version": "5", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root))
    app = App(load_settings(cfg, http_port=0, grpc_port=None))
    with pytest.raises(StartupError, match=r"models\[0\]\.path.*does not exist") as info:
        await app.start()
    assert "models[1].default_version: model 'wrong-default' has no version '5'" in str(info.value)
    assert app.health_view().fork_server_alive is False, "what started is stopped"


async def test_without_exit_on_error_failed_preloads_stay_in_the_index_as_failed(
    model_root: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "add", "path": "add", "isolation": "inline", "preload": True},
        {"name": "corrupt", "path": "corrupt", "isolation": "inline", "preload": True},
        {"name": "missing", "path": "gone", "preload": True},
    ]
    cfg = write_config(tmp_path, models, model_repository=str(model_root), exit_on_error=False)
    async with running_server(cfg) as (_, client):
        index = (await client.post("/v2/repository/index", json={})).json()
        assert _row(index, "add")["state"] == "READY"
        corrupt = _row(index, "corrupt")
        assert corrupt["state"] == "FAILED"
        assert "failed to load" in corrupt["reason"]
        assert _row(index, "missing")["state"] == "FAILED"
        assert "does not exist" in _row(index, "missing")["reason"]
