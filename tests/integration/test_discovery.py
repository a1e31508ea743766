"""Models added without a restart: loading a repository folder the YAML does not list."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson

from modelyard.examples.mlp import build_add_onnx
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


async def test_a_new_model_folder_is_loaded_and_served_without_a_restart(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_add_onnx(repo / "known" / "1" / "model.onnx", 1.0)
    cfg = write_config(
        tmp_path,
        [{"name": "known", "path": "known"}],
        model_repository=str(repo),
        remote_load={"allow_inline": True},
    )
    async with running_server(cfg) as (app, client):
        assert (await client.post("/v2/models/fresh/infer", json=BODY)).status_code == 404
        # A user copies a model into the repository while the server runs ...
        staging = tmp_path / "staging"
        build_add_onnx(staging / "1" / "model.onnx", 7.0)
        shutil.copytree(staging, repo / "fresh")
        # ... and loads it, with part of its config given in the request (Triton's way).
        config = orjson.dumps({"isolation": "inline", "max_batch_size": 4}).decode()
        r = await client.post(
            "/v2/repository/models/fresh/load", json={"parameters": {"config": config}}
        )
        assert r.status_code == 200, r.text
        r = await client.post("/v2/models/fresh/infer", json=BODY)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [7.0] * 4
        record = app.manager.resolve("fresh", None)
        assert record.config.runtime == "onnx", "the runtime was guessed from the files"
        assert record.config.isolation == "inline"
        assert record.config.max_batch_size == 4
        index = (await client.post("/v2/repository/index", json={})).json()
        assert {"name": "fresh", "version": "1", "state": "READY", "reason": ""} in index
        # A loaded model cannot be reconfigured under its requests; unloaded, it can.
        r = await client.post(
            "/v2/repository/models/fresh/load",
            json={"parameters": {"config": {"max_batch_size": 2}}},
        )
        assert r.status_code == 409
        assert (await client.post("/v2/repository/models/fresh/unload")).status_code == 200
        r = await client.post(
            "/v2/repository/models/fresh/load",
            json={"parameters": {"config": {"max_batch_size": 2}}},
        )
        assert r.status_code == 200, r.text
        assert app.manager.resolve("fresh", None).config.max_batch_size == 2


async def test_bad_configs_and_missing_folders_are_clear_errors(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_add_onnx(repo / "known" / "1" / "model.onnx", 1.0)
    build_add_onnx(repo / "other" / "1" / "model.onnx", 1.0)
    (repo / "empty").mkdir()
    cfg = write_config(tmp_path, [{"name": "known", "path": "known"}], model_repository=str(repo))
    async with running_server(cfg) as (_, client):
        r = await client.post("/v2/repository/models/nowhere/load")
        assert r.status_code == 404
        assert "'nowhere' is not in the repository" in r.json()["error"]
        r = await client.post("/v2/repository/models/empty/load")
        assert r.status_code == 404
        assert "no version folders" in r.json()["error"]
        r = await client.post(
            "/v2/repository/models/other/load",
            json={"parameters": {"config": {"max_batch_size": -1}}},
        )
        assert r.status_code == 400
        assert "max_batch_size" in r.json()["error"]
        r = await client.post(
            "/v2/repository/models/other/load", json={"parameters": {"config": "{not json"}}
        )
        assert r.status_code == 400
        assert "not valid JSON" in r.json()["error"]
        assert (await client.post("/v2/models/known/infer", json=BODY)).status_code == 200
