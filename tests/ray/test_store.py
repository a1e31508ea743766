"""Model files from a shared store (``ray.model_store``) on a local two-node cluster.

The server's own repository and the store are different folders holding different
models under the same names: the server's ``add-1`` adds 9, the store's adds 1. So an
answer of ``input + 1`` shows that the actor loaded the store's copy, fetched into its
node's cache, and never read the server's path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ray.conftest import LocalCluster, add_body, expected, ray_server
from tests.servers import write_config

ray = pytest.importorskip("ray", reason="Ray mode needs the 'ray' extra")
pytest.importorskip("fsspec", reason="the model store needs fsspec (the 'ray' extra)")

from modelyard.examples.mlp import build_add_onnx  # noqa: E402
from modelyard.manager.states import ModelState  # noqa: E402
from modelyard.repository.manifest import write_manifest  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _repositories(tmp_path: Path) -> tuple[Path, Path]:
    """The server's repository (wrong answers, no manifests) and the store (right ones,
    with manifests; ``add-2``'s file changed after its manifest was written)."""
    server, store = tmp_path / "server-repo", tmp_path / "store"
    for k in (1, 2):
        build_add_onnx(server / f"add-{k}" / "1" / "model.onnx", 9.0)
        folder = store / f"add-{k}" / "1"
        build_add_onnx(folder / "model.onnx", float(k))
        write_manifest(folder)
    build_add_onnx(store / "add-2" / "1" / "model.onnx", 7.0)  # not what the manifest says
    return server, store


def _cached(folder: Path, pattern: str) -> list[Path]:
    return list(folder.glob(pattern))


async def test_actors_load_the_stores_files_from_their_nodes_cache(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    server_repo, store = _repositories(tmp_path)
    cache = tmp_path / "cache-{node}"
    models = [{"name": f"add-{k}", "path": f"add-{k}", "memory_mb": 120} for k in (1, 2)]
    config = write_config(server_repo, models)
    async with ray_server(config, model_store=store.as_uri(), node_cache_dir=str(cache)) as (
        app,
        client,
    ):
        r = await client.post("/v2/models/add-1/infer", json=add_body())
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == expected(1)
        record = app.manager.record_for("add-1", "1")
        assert record.info is not None
        assert record.info.details["store_fetch"] == "fetched"
        assert record.info.details["manifest_verified_on_node"] is True
        node = record.device.split("/")[0]
        cached = _cached(tmp_path, f"cache-{node}/add-1/1.*/model.onnx")
        assert len(cached) == 1
        assert cached[0].read_bytes() == (store / "add-1" / "1" / "model.onnx").read_bytes()

        # Loaded again: from the cache of the node it lands on, fetched there only once.
        assert (await client.post("/v2/repository/models/add-1/unload")).status_code == 200
        assert (await client.post("/v2/repository/models/add-1/load")).status_code == 200
        again = app.manager.record_for("add-1", "1")
        assert again.info is not None
        want = "cached" if again.device == record.device else "fetched"
        assert again.info.details["store_fetch"] == want
        r = await client.post("/v2/models/add-1/infer", json=add_body())
        assert r.json()["outputs"][0]["data"] == expected(1)

        # A stored file that does not match its manifest: a typed load failure, never
        # loaded, and nothing of it is published in a node's cache.
        r = await client.post("/v2/repository/models/add-2/load")
        assert r.status_code == 503, r.text
        assert "SHA256" in r.json()["error"], r.text
        assert app.manager.record_for("add-2", "1").state is ModelState.FAILED
        assert _cached(tmp_path, "cache-*/add-2/1.*/model.onnx") == []
        r = await client.post("/v2/models/add-2/infer", json=add_body())
        assert r.status_code == 503, r.text
        # The server keeps serving the good model.
        r = await client.post("/v2/models/add-1/infer", json=add_body())
        assert r.status_code == 200, r.text
