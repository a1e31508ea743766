"""Schemathesis fuzzing of the served OpenAPI document against a real server.

A fixed seed, every operation in positive and negative mode, model operations also aimed
at the repository's real models. Zero 5xx answers, zero requests without an answer, every
answer one the document describes, and a good request still succeeds afterwards.
``bench/fuzz_server.py`` runs the same cases at a larger budget (100,000 by default).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from modelyard.frontends.http.openapi import OPENAPI_PATH
from tests.security.http_fuzz import FuzzReport, fuzz
from tests.servers import running_server, write_config

SEED = 20261201
DEFAULT_CASES = 60
"""The default suite's budget: a quick smoke of the whole document."""
CI_CASES = 2_000
"""The slow (CI) run's budget."""
MODELS: list[dict[str, object]] = [
    {"name": "digits-logreg", "path": "digits-logreg", "preload": True, "isolation": "inline"},
    {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
    {"name": "types", "path": "types", "isolation": "inline"},
]
MODEL_NAMES = [str(m["name"]) for m in MODELS]
GOOD_REQUEST = {
    "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]
}


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    return write_config(tmp_path, MODELS, model_repository=str(model_root))


async def _fuzz_real_server(config_file: Path, cases: int) -> FuzzReport:
    async with running_server(config_file) as (app, client):
        document = (await client.get(OPENAPI_PATH)).json()
        base_url = f"http://127.0.0.1:{app.http_port}"
        # Synchronous schemathesis calls run in a thread; the server keeps this loop.
        report = await asyncio.to_thread(
            fuzz, base_url, document, cases=cases, seed=SEED, model_names=MODEL_NAMES
        )
        await _still_serving(client)
    return report


async def _still_serving(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/health/live")).status_code == 200
    good = await client.post("/v2/models/digits-logreg/infer", json=GOOD_REQUEST)
    assert good.status_code == 200, good.text
    assert {o["name"] for o in good.json()["outputs"]} == {"label", "probabilities"}


def _assert_clean(report: FuzzReport, cases: int) -> None:
    assert report.cases == cases, report.summary()
    assert report.server_errors == [], "\n".join(report.server_errors[:20])
    assert report.transport_errors == [], "\n".join(report.transport_errors[:20])
    assert report.nonconforming == [], "\n".join(report.nonconforming[:5])
    # The cases reached real models, not only 404s.
    assert report.statuses[200] > 0, report.summary()
    assert report.statuses[400] > 0, report.summary()


async def test_schemathesis_small_budget(config_file: Path) -> None:
    report = await _fuzz_real_server(config_file, DEFAULT_CASES)
    _assert_clean(report, DEFAULT_CASES)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_schemathesis_ci_budget(config_file: Path) -> None:
    report = await _fuzz_real_server(config_file, CI_CASES)
    _assert_clean(report, CI_CASES)
