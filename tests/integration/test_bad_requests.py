"""Every malformed request gets a typed error with the right status; the server keeps serving."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.servers import running_server, write_config

LIMIT = 200_000


def _tensor(**over: Any) -> dict[str, Any]:
    t: dict[str, Any] = {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
    t.update(over)
    return t


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    error: str
    """A fragment the error message must contain."""
    body: bytes | None = None
    path: str = "/v2/models/digits-logreg/infer"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)


def _j(doc: object) -> bytes:
    return orjson.dumps(doc)


CASES = [
    Case("malformed-json", 400, "not valid JSON", b'{"inputs": [}'),
    Case("body-not-object", 400, "JSON object", _j([1, 2, 3])),
    Case("missing-inputs", 400, "'inputs'", _j({"id": "x"})),
    Case("empty-inputs", 400, "'inputs'", _j({"inputs": []})),
    Case("unknown-datatype", 400, "unknown datatype", _j({"inputs": [_tensor(datatype="FP128")]})),
    Case(
        "wrong-datatype",
        400,
        "does not match the model's FP32",
        _j({"inputs": [_tensor(datatype="INT64", data=[0] * 64)]}),
    ),
    Case(
        "wrong-rank",
        400,
        "does not match the model's",
        _j({"inputs": [_tensor(shape=[64], data=[0.0] * 64)]}),
    ),
    Case(
        "wrong-width",
        400,
        "does not match the model's",
        _j({"inputs": [_tensor(shape=[1, 32], data=[0.0] * 32)]}),
    ),
    Case(
        "count-mismatch",
        400,
        "needs 64 elements, got 10",
        _j({"inputs": [_tensor(data=[0.0] * 10)]}),
    ),
    Case("negative-dim", 400, "non-negative integers", _j({"inputs": [_tensor(shape=[-1, 64])]})),
    Case("data-not-list", 400, "'data' must be a list", _j({"inputs": [_tensor(data="abc")]})),
    Case(
        "strings-for-fp32",
        400,
        "does not fit datatype FP32",
        _j({"inputs": [_tensor(data=["a"] * 64)]}),
    ),
    Case("null-in-fp32", 400, "got null", _j({"inputs": [_tensor(data=[0.0] * 63 + [None])]})),
    Case("bool-in-fp32", 400, "got a boolean", _j({"inputs": [_tensor(data=[True] + [0.0] * 63)]})),
    Case(
        "fraction-after-16th-int",
        400,
        "got a fraction",
        _j({"inputs": [_tensor(datatype="INT64", data=[0] * 63 + [0.5])]}),
    ),
    Case(
        "ragged-nested-data",
        400,
        "rectangular",
        _j({"inputs": [_tensor(shape=[2, 2], data=[[0.0, 1.0], [2.0]])]}),
    ),
    Case("unknown-input", 400, "has no input 'pixels'", _j({"inputs": [_tensor(name="pixels")]})),
    Case("input-twice", 400, "given twice", _j({"inputs": [_tensor(), _tensor()]})),
    Case(
        "missing-data",
        400,
        "missing 'data'",
        _j({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32"}]}),
    ),
    Case(
        "unknown-output",
        400,
        "requested output 'nope'",
        _j({"inputs": [_tensor()], "outputs": [{"name": "nope"}]}),
    ),
    Case(
        "output-twice",
        400,
        "output 'label' is requested twice",
        _j({"inputs": [_tensor()], "outputs": [{"name": "label"}] * 3}),
    ),
    Case(
        "bad-priority",
        400,
        "'priority'",
        _j({"inputs": [_tensor()], "parameters": {"priority": "high"}}),
    ),
    Case(
        "bad-timeout",
        400,
        "'timeout'",
        _j({"inputs": [_tensor()], "parameters": {"timeout": -5}}),
    ),
    Case(
        "bad-binary-header",
        400,
        "outside the",
        _j({"inputs": [_tensor()]}),
        headers={"Inference-Header-Content-Length": "999999"},
    ),
    Case(
        "binary-size-mismatch",
        400,
        "out of range",
        _j({"inputs": [_tensor(data=None, parameters={"binary_data_size": 256})]}) + b"\0" * 16,
        headers={
            "Inference-Header-Content-Length": str(
                len(_j({"inputs": [_tensor(data=None, parameters={"binary_data_size": 256})]}))
            )
        },
    ),
    Case(
        "unknown-model",
        404,
        "'nope' is not in the repository",
        _j({"inputs": [_tensor()]}),
        path="/v2/models/nope/infer",
    ),
    Case(
        "unknown-version",
        404,
        "has no version '7'",
        _j({"inputs": [_tensor()]}),
        path="/v2/models/digits-logreg/versions/7/infer",
    ),
    Case(
        "failed-model",
        503,
        "failed to load",
        _j({"inputs": [_tensor()]}),
        path="/v2/models/corrupt/infer",
    ),
    Case("payload-too-large", 413, "limit", b"[" + b"0," * LIMIT + b"0]"),
    Case("wrong-method", 405, "not allowed", None, method="GET"),
    Case("unknown-route", 404, "no route", b"{}", path="/v2/nothing/here"),
    Case(
        "predict-no-model", 400, "'model'", _j({"inputs": {"input": [0.0] * 64}}), path="/predict"
    ),
    Case(
        "predict-text-on-numeric-model",
        400,
        "'text' needs a model with one BYTES input",
        _j({"model": "digits-logreg", "text": "hello"}),
        path="/predict",
    ),
]


@pytest.fixture
def config_file(model_root: Path, tmp_path: Path) -> Path:
    models = [
        {"name": "digits-logreg", "path": "digits-logreg", "preload": True, "isolation": "inline"},
        {"name": "corrupt", "path": "corrupt", "isolation": "inline"},
    ]
    return write_config(tmp_path, models, model_repository=str(model_root), max_request_bytes=LIMIT)


async def test_bad_requests_get_typed_errors_and_server_keeps_serving(config_file: Path) -> None:
    async with running_server(config_file) as (_, client):
        for case in CASES:
            r = await client.request(
                case.method, case.path, content=case.body, headers=case.headers
            )
            assert r.status_code == case.status, (case.id, r.status_code, r.text)
            doc = r.json()
            assert set(doc) == {"error"}, case.id
            assert case.error in doc["error"], (case.id, doc["error"])
        good = await client.post("/v2/models/digits-logreg/infer", json={"inputs": [_tensor()]})
        assert good.status_code == 200
        assert (await client.get("/v2/health/ready")).status_code == 200


def test_there_are_at_least_fifteen_kinds() -> None:
    assert len({c.id for c in CASES}) >= 15
