"""share_weights under the budget: a mapped weight file is charged once, while mapped.

Two versions of one model map the same external-data file (version 2's is a hard link to
version 1's: ONNX Runtime refuses external data a symlink leads out of the model folder). Whatever
the order of loads and unloads, the budget must hold at least what the workers really
use: each one's private memory plus the file's pages once.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from modelyard.app import App
from modelyard.examples.mlp import build_mlp_onnx
from modelyard.workers.footprint import MappedFile
from tests.servers import running_server, settled, write_config

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
WEIGHTS_MB = 24
GROWTH_SLACK = 4 * MIB


@pytest.fixture(scope="module")
def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shared-repo")
    v1 = build_mlp_onnx(root / "big" / "1" / "model.onnx", WEIGHTS_MB, external_data=True)
    v2 = root / "big" / "2" / "model.onnx"
    v2.parent.mkdir()
    v2.write_bytes(v1.read_bytes())
    os.link(v1.parent / "model.onnx.data", v2.parent / "model.onnx.data")
    return root


def _body() -> dict[str, object]:
    return {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]}


def _workers_memory(app: App) -> int:
    """What the resident workers hold: private memory plus mapped weight pages once."""
    total = 0
    weight_pss = 0
    for record in app.manager.records():
        if record.info is None or record.info.pid is None or not record.is_ready:
            continue
        info = psutil.Process(record.info.pid).memory_full_info()
        total += info.uss
        for m in psutil.Process(record.info.pid).memory_maps(grouped=True):
            if m.path.endswith(".data"):
                # The file's pages mapped by several workers: each worker's share (PSS)
                # sums to the pages once; what is private is in the USS already.
                weight_pss += m.pss - m.private_clean - m.private_dirty
    return total + weight_pss


async def test_two_versions_mapping_one_file_are_charged_for_it_once(
    shared_root: Path, tmp_path: Path
) -> None:
    cfg = write_config(
        tmp_path,
        [{"name": "big", "path": "big", "share_weights": True, "version_policy": {"all": True}}],
        model_repository=str(shared_root),
        devices=[{"name": "cpu", "memory_budget_mb": 512}],
    )
    weights = MappedFile.of(shared_root / "big" / "1" / "model.onnx.data")
    async with running_server(cfg) as (app, client):
        dev = app.manager.budget.device("cpu")
        for path in ("/v2/models/big/versions/1/infer", "/v2/models/big/versions/2/infer"):
            assert (await client.post(path, json=_body())).status_code == 200
            # Each footprint is read after its load's first answer (answers.py), so
            # version 1 is measured before version 2 maps the file only if this waits.
            await settled(app)
        assert list(dev.shared) == [weights]
        assert dev.shared[weights].users == {r.key for r in app.manager.records()}
        v1, v2 = app.manager.entry("big").versions["1"], app.manager.entry("big").versions["2"]
        # Each version is charged its private part, without the weights. Version 1 alone
        # mapped the file when it was measured, so its USS holds the file's pages (and the
        # runtime's code pages it touched first, about 10 MiB here: why this compares with
        # its USS rather than a fixed size); version 2's USS holds neither.
        assert v1.info is not None
        uss = v1.info.details["uss_bytes"]
        assert isinstance(uss, int)
        assert dev.reservations[v1.key] <= uss - 0.9 * weights.size
        assert dev.reservations[v2.key] < weights.size / 2
        assert dev.reserved_bytes == (
            dev.reservations[v1.key] + dev.reservations[v2.key] + weights.size
        )
        # Measured while version 2 maps the file: version 1's USS holds none of it, so
        # without the ledger the budget would hold the weights for nobody.
        assert (await client.post("/v2/repository/models/big/unload", json={})).status_code == 200
        assert dev.reserved_bytes == 0
        assert dev.shared == {}
        for path in ("/v2/models/big/versions/2/infer", "/v2/models/big/versions/1/infer"):
            assert (await client.post(path, json=_body())).status_code == 200
        await settled(app)
        used = _workers_memory(app)
        # Slack: a worker's allocator grows a little after its footprint was measured
        # (the memory-pressure tests document the same allowance at scale).
        assert used <= dev.reserved_bytes + GROWTH_SLACK, (used / MIB, dev.reserved_bytes / MIB)
        assert dev.reserved_bytes >= weights.size
        # The file stays charged while either version maps it, and goes with the last.
        await app.manager.unload("big", "1")
        assert list(dev.shared) == [weights]
        assert app.manager.budget.reserved("cpu", v2.key) == dev.reservations[v2.key] + weights.size
        await app.manager.unload("big", "2")
        assert dev.shared == {}
        assert dev.reserved_bytes == 0


async def test_models_sharing_a_file_are_evicted_together_when_only_that_makes_room(
    tmp_path: Path,
) -> None:
    # Three models map one 24 MiB file (6 MiB private each, 42 MiB in all); a model that
    # needs 44 MiB of a 64 MiB budget fits only once all three have gone, since evicting
    # one or two of them frees their private parts and not the file.
    repo = tmp_path / "repo"
    first = build_mlp_onnx(repo / "src" / "1" / "model.onnx", WEIGHTS_MB, external_data=True)
    for name in ("s1", "s2", "s3"):
        version = repo / name / "1"
        version.mkdir(parents=True)
        (version / "model.onnx").write_bytes(first.read_bytes())
        os.link(first.parent / "model.onnx.data", version / "model.onnx.data")
    build_mlp_onnx(repo / "big" / "1" / "model.onnx", 4, seed=3)
    models: list[dict[str, object]] = [
        {"name": n, "path": n, "share_weights": True} for n in ("s1", "s2", "s3")
    ]
    models.append({"name": "big", "path": "big", "memory_mb": 44})
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(repo),
        devices=[{"name": "cpu", "memory_budget_mb": 64}],
    )
    async with running_server(cfg) as (app, client):
        dev = app.manager.budget.device("cpu")
        for name in ("s1", "s2", "s3"):
            assert (await client.post(f"/v2/models/{name}/infer", json=_body())).status_code == 200
        assert dev.shared_bytes > 20 * MIB
        r = await client.post("/v2/models/big/infer", json=_body())
        assert r.status_code == 200, r.text
        await settled(app)
        states = {rec.key.name: rec.state.value for rec in app.manager.records()}
        assert states == {"s1": "UNLOADED", "s2": "UNLOADED", "s3": "UNLOADED", "big": "READY"}
        assert dev.shared == {}
        assert dev.reserved_bytes <= dev.budget_bytes
