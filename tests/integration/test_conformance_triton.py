"""Conformance with Triton's protocol extensions, through the stock tritonclient packages.

Each test drives a real server (real worker processes, ONNX models built here) with
``tritonclient.http`` and ``tritonclient.grpc`` unchanged, on both transports where the
point exists on both: statistics, model configuration, the raw binary request,
``priority``/``timeout`` 0, string-casting models, zero-element and non-UTF-8 BYTES,
classification, optional inputs, ``file:`` load parameters, the versions model
metadata lists in poll mode, and the logging extension. Written for modelyard; no
test is copied from Triton.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.repository.manifest import write_manifest
from tests.servers import running_server, write_config

LABELS = ["cat", "dog", "bird", "fish"]
X = np.array([[0.1, 0.7, 0.2, 0.0], [0.5, 0.1, 0.1, 0.3]], dtype=np.float32)
BIAS = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))


def build_strcast(path: Path) -> None:
    """``value = float(text)``: an ONNX graph casting its string input to a number."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["text"], ["value"], to=TensorProto.FLOAT)],
        "strcast",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["n"])],
    )
    _save(graph, path)


def build_scores(path: Path) -> None:
    """``probs = x`` over [batch, 4]: the scores a classifier would give."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["probs"])],
        "scores",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 4])],
    )
    _save(graph, path)


def build_biased(path: Path) -> None:
    """``y = x + bias`` where ``bias`` is an input with a default (an initialiser)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "biased",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=[helper.make_tensor("bias", TensorProto.FLOAT, [4], BIAS.tolist())],
    )
    _save(graph, path)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("conformance")
    build_strcast(root / "strcast" / "1" / "model.onnx")
    build_scores(root / "scores" / "1" / "model.onnx")
    (root / "scores" / "labels.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
    build_biased(root / "biased" / "1" / "model.onnx")
    return root


def _config(repo: Path, tmp_path: Path) -> Path:
    models = [
        {"name": "strcast", "path": "strcast", "preload": True},
        {"name": "scores", "path": "scores", "preload": True, "max_queue_delay_s": 0.001},
        {"name": "biased", "path": "biased", "preload": True},
    ]
    return write_config(tmp_path, models, model_repository=str(repo))


async def _both(
    repo: Path, tmp_path: Path, session: Callable[[thttp.InferenceServerClient, Any], Any]
) -> Any:
    """Run ``session(http_client, grpc_client)`` against a fresh server, in a thread."""
    async with running_server(_config(repo, tmp_path), grpc=True) as (app, _):
        assert app.http_port is not None
        assert app.grpc_port is not None

        def run() -> Any:
            http = thttp.InferenceServerClient(f"127.0.0.1:{app.http_port}")
            rpc = tgrpc.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
            try:
                return session(http, rpc)
            finally:
                http.close()
                rpc.close()

        return await asyncio.to_thread(run)


def _http_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> thttp.InferInput:
    tensor = thttp.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _grpc_input(name: str, array: np.ndarray, datatype: str) -> tgrpc.InferInput:
    tensor = tgrpc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _ints(doc: Any) -> Any:
    """gRPC's JSON writes 64-bit integers as strings; REST writes numbers."""
    if isinstance(doc, dict):
        return {k: _ints(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_ints(v) for v in doc]
    if isinstance(doc, str) and doc.lstrip("-").isdigit():
        return int(doc)
    return doc


# ---------------------------------------------------------------------- statistics


async def test_statistics_extension_on_both_transports(repo: Path, tmp_path: Path) -> None:
    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        for _ in range(2):
            http.infer("scores", [_http_input("x", X, "FP32", True)])
        rpc.infer("scores", [_grpc_input("x", X[:1], "FP32")])
        with pytest.raises(InferenceServerException):  # a wrong shape: one failure
            http.infer("scores", [_http_input("x", np.zeros((1, 3), np.float32), "FP32", True)])
        return {
            "http-all": http.get_inference_statistics(),
            "http-model": http.get_inference_statistics("scores"),
            "http-version": http.get_inference_statistics("scores", "1"),
            "grpc-model": _ints(rpc.get_inference_statistics("scores", as_json=True)),
            "grpc-all": _ints(rpc.get_inference_statistics(as_json=True)),
            "grpc-unknown": _grpc_error(lambda: rpc.get_inference_statistics("nope")),
            "http-unknown": _http_error(lambda: http.get_inference_statistics("nope")),
        }

    seen = await _both(repo, tmp_path, session)
    (stat,) = seen["http-version"]["model_stats"]
    assert seen["http-model"] == seen["http-version"]
    assert {(s["name"], s["version"]) for s in seen["http-all"]["model_stats"]} == {
        ("biased", "1"),
        ("scores", "1"),
        ("strcast", "1"),
    }
    assert stat["name"] == "scores"
    assert stat["version"] == "1"
    stats = stat["inference_stats"]
    assert stats["success"]["count"] == 3
    assert stats["success"]["ns"] > 0
    assert stats["fail"]["count"] == 1
    assert stat["inference_count"] == 2 + 2 + 1  # batch rows of the successful requests
    assert stats["queue"]["count"] == 3
    assert stats["compute_infer"]["count"] == 3
    assert stats["compute_infer"]["ns"] > 0
    assert 1 <= stat["execution_count"] <= 3
    assert sum(b["compute_infer"]["count"] for b in stat["batch_stats"]) == stat["execution_count"]
    assert {b["batch_size"] for b in stat["batch_stats"]} <= {1, 2, 3, 4, 5}
    assert stat["last_inference"] > 0
    # gRPC reads the same counters (its request came after nothing changed them).
    (grpc_stat,) = seen["grpc-model"]["model_stats"]
    assert grpc_stat["inference_count"] == stat["inference_count"]
    assert grpc_stat["inference_stats"]["success"] == stats["success"]
    assert len(seen["grpc-all"]["model_stats"]) == 3
    assert seen["grpc-unknown"][0] == grpc.StatusCode.NOT_FOUND
    assert seen["http-unknown"][0] == "404"


async def test_stats_routes_leave_the_servers_own_stats_route(repo: Path, tmp_path: Path) -> None:
    async with running_server(_config(repo, tmp_path)) as (_, client):
        models = await client.get("/v2/models/stats")
        own = await client.get("/v2/stats")
        missing = await client.get("/v2/models/nope/versions/1/stats")
    assert models.status_code == 200
    assert [s["name"] for s in models.json()["model_stats"]] == ["biased", "scores", "strcast"]
    assert own.status_code == 200
    assert "model_stats" not in own.json()
    assert missing.status_code == 404


def _grpc_error(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    status = info.value.status()
    code = getattr(grpc.StatusCode, str(status).removeprefix("StatusCode."))
    return code, info.value.message()


def _http_error(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.status()), info.value.message()


# ---------------------------------------------------------------------- model configuration


async def test_model_configuration_on_both_transports(repo: Path, tmp_path: Path) -> None:
    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        return {
            "http": http.get_model_config("scores"),
            "http-biased": http.get_model_config("biased", "1"),
            "grpc": _ints(rpc.get_model_config("scores", as_json=True))["config"],
            "grpc-biased": _ints(rpc.get_model_config("biased", as_json=True))["config"],
            "extensions": http.get_server_metadata()["extensions"],
        }

    seen = await _both(repo, tmp_path, session)
    config = seen["http"]
    assert config["name"] == "scores"
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert config["max_batch_size"] == 8
    assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert config["input"] == [
        {"name": "x", "data_type": "TYPE_FP32", "dims": [4], "optional": False}
    ]
    assert config["output"] == [
        {"name": "probs", "data_type": "TYPE_FP32", "dims": [4], "label_filename": "labels.txt"}
    ]
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [],
        "max_queue_delay_microseconds": 1000,
    }
    # gRPC's JSON leaves out fields at their defaults; what it has agrees.
    grpc_config = seen["grpc"]
    assert grpc_config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}]
    assert grpc_config["max_batch_size"] == 8
    assert grpc_config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert grpc_config["output"][0]["label_filename"] == "labels.txt"
    # A fixed-shape input (the optional bias) means no batching: full dims, batch size 0.
    biased = seen["http-biased"]
    assert biased["max_batch_size"] == 0
    assert "dynamic_batching" not in biased
    assert biased["input"] == [
        {"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 4], "optional": False},
        {"name": "bias", "data_type": "TYPE_FP32", "dims": [4], "optional": True},
    ]
    assert seen["grpc-biased"]["input"][1] == {
        "name": "bias",
        "data_type": "TYPE_FP32",
        "dims": [4],
        "optional": True,
    }
    assert {"statistics", "classification", "model_configuration"} <= set(seen["extensions"])


# ---------------------------------------------------------------------- raw binary request


async def test_raw_binary_request_and_the_binary_extension(repo: Path, tmp_path: Path) -> None:
    raw = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
    async with running_server(_config(repo, tmp_path)) as (app, client):
        floats = await client.post("/v2/models/scores/infer", content=X.tobytes(), headers=raw)
        text = await client.post("/v2/models/strcast/infer", content=b"2.5", headers=raw)
        ragged = await client.post("/v2/models/scores/infer", content=b"1234567", headers=raw)
        two = await client.post("/v2/models/biased/infer", content=X.tobytes(), headers=raw)
        assert app.http_port is not None

        def binary_session() -> np.ndarray:
            http = thttp.InferenceServerClient(f"127.0.0.1:{app.http_port}")
            strings = np.array([b"1.5", b"-2"], dtype=object)
            result = http.infer(
                "strcast",
                [_http_input("text", strings, "BYTES", True)],
                outputs=[thttp.InferRequestedOutput("value", binary_data=True)],
            )
            http.close()
            value: np.ndarray = result.as_numpy("value")
            return value

        binary = await asyncio.to_thread(binary_session)
    assert floats.status_code == 200, floats.text
    (out,) = floats.json()["outputs"]
    assert out["shape"] == [2, 4]
    np.testing.assert_allclose(out["data"], X.reshape(-1))
    assert text.status_code == 200, text.text
    assert text.json()["outputs"][0]["data"] == [2.5]
    assert ragged.status_code == 400
    assert "FP32" in ragged.json()["error"]
    assert "'x'" in ragged.json()["error"]
    # ``biased`` has one required input: the raw body is it, the optional one keeps its default.
    assert two.status_code == 200, two.text
    np.testing.assert_allclose(two.json()["outputs"][0]["data"], (X + BIAS).reshape(-1))
    np.testing.assert_allclose(binary, [1.5, -2.0])


# ---------------------------------------------------------------------- priority and timeout 0


async def test_priority_and_timeout_zero_mean_the_default(repo: Path, tmp_path: Path) -> None:
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}],
        "parameters": {"priority": 0, "timeout": 0},
    }
    async with running_server(_config(repo, tmp_path), grpc=True) as (app, client):
        rest = await client.post("/v2/models/scores/infer", json=doc)
        message = pb.ModelInferRequest(model_name="scores")
        message.inputs.add(name="x", datatype="FP32", shape=[2, 4])
        message.raw_input_contents.append(X.tobytes())
        message.parameters["priority"].uint64_param = 0
        message.parameters["timeout"].int64_param = 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            reply = await stub.ModelInfer(message)

        def stock() -> np.ndarray:
            http = thttp.InferenceServerClient(f"127.0.0.1:{app.http_port}")
            rpc = tgrpc.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
            a = http.infer("scores", [_http_input("x", X, "FP32", True)], timeout=0)
            b = rpc.infer("scores", [_grpc_input("x", X, "FP32")], timeout=0)
            http.close()
            rpc.close()
            return np.stack([a.as_numpy("probs"), b.as_numpy("probs")])

        both = await asyncio.to_thread(stock)
    assert rest.status_code == 200, rest.text
    assert np.frombuffer(reply.raw_output_contents[0], np.float32).tolist() == X.ravel().tolist()
    np.testing.assert_array_equal(both, np.stack([X, X]))


# ---------------------------------------------------------------------- BYTES


async def test_string_cast_model_loads_and_bytes_edge_cases(repo: Path, tmp_path: Path) -> None:
    """A graph casting BYTES to a number loads (its warm-up input is numeric text);
    zero-element BYTES tensors work; non-UTF-8 bytes are refused naming the input."""
    empty = np.array([], dtype=object)
    bad = np.array([b"\xff\xfe"], dtype=object)

    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        seen: dict[str, Any] = {"ready": http.is_model_ready("strcast")}
        for binary in (True, False):
            out = http.infer("strcast", [_http_input("text", empty, "BYTES", binary)])
            seen[f"http-empty-{binary}"] = out.as_numpy("value")
        seen["grpc-empty"] = rpc.infer("strcast", [_grpc_input("text", empty, "BYTES")]).as_numpy(
            "value"
        )
        numbers = np.array([b"1.25", b"3"], dtype=object)
        seen["grpc-numbers"] = rpc.infer(
            "strcast", [_grpc_input("text", numbers, "BYTES")]
        ).as_numpy("value")
        seen["http-bad"] = _http_error(
            lambda: http.infer("strcast", [_http_input("text", bad, "BYTES", True)])
        )
        seen["grpc-bad"] = _grpc_error(
            lambda: rpc.infer("strcast", [_grpc_input("text", bad, "BYTES")])
        )
        # Zero rows of a numeric input, through a batching model, with timeout 0.
        rows = np.zeros((0, 4), dtype=np.float32)
        seen["http-zero-rows"] = http.infer(
            "scores", [_http_input("x", rows, "FP32", True)], timeout=0
        ).as_numpy("probs")
        seen["grpc-zero-rows"] = rpc.infer(
            "scores", [_grpc_input("x", rows, "FP32")], timeout=0
        ).as_numpy("probs")
        return seen

    seen = await _both(repo, tmp_path, session)
    assert seen["ready"] is True
    for key in ("http-empty-True", "http-empty-False", "grpc-empty"):
        assert seen[key].shape == (0,), key
    assert seen["http-zero-rows"].shape == (0, 4)
    assert seen["grpc-zero-rows"].shape == (0, 4)
    np.testing.assert_array_equal(seen["grpc-numbers"], [1.25, 3.0])
    status, message = seen["http-bad"]
    assert status == "400"
    assert "'text'" in message
    assert "UTF-8" in message
    code, message = seen["grpc-bad"]
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'text'" in message


# ---------------------------------------------------------------------- classification


def _expected_classes(scores: np.ndarray, k: int) -> list[list[bytes]]:
    rows = []
    for row in scores:
        top = sorted(range(len(row)), key=lambda i: -row[i])[:k]
        rows.append([f"{row[i]:f}:{i}:{LABELS[i]}".encode() for i in top])
    return rows


async def test_classification_on_both_transports(repo: Path, tmp_path: Path) -> None:
    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        http_out = http.infer(
            "scores",
            [_http_input("x", X, "FP32", True)],
            outputs=[thttp.InferRequestedOutput("probs", binary_data=False, class_count=2)],
        )
        grpc_out = rpc.infer(
            "scores",
            [_grpc_input("x", X, "FP32")],
            outputs=[tgrpc.InferRequestedOutput("probs", class_count=9)],
        )
        return {
            "http": http_out.as_numpy("probs"),
            "http-params": http_out.get_output("probs"),
            "grpc": grpc_out.as_numpy("probs"),
        }

    seen = await _both(repo, tmp_path, session)
    # JSON carries BYTES as text: tritonclient gives str there, bytes from binary data.
    http_rows = [[v.encode() if isinstance(v, str) else v for v in row] for row in seen["http"]]
    assert http_rows == _expected_classes(X, 2)
    assert "classification" not in (seen["http-params"].get("parameters") or {})
    assert seen["grpc"].tolist() == _expected_classes(X, 4)  # k past the classes: all of them


async def test_bad_classification_is_refused_by_name(repo: Path, tmp_path: Path) -> None:
    doc = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": X.ravel().tolist()}],
        "outputs": [{"name": "probs", "parameters": {"classification": "two"}}],
    }
    async with running_server(_config(repo, tmp_path)) as (_, client):
        r = await client.post("/v2/models/scores/infer", json=doc)
        again = await client.post("/v2/models/scores/infer", json={"inputs": doc["inputs"]})
    assert r.status_code == 400
    assert "'classification'" in r.json()["error"]
    assert again.status_code == 200


# ---------------------------------------------------------------------- optional inputs


async def test_optional_input_may_be_left_out(repo: Path, tmp_path: Path) -> None:
    other = np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)

    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        return {
            "http-default": http.infer("biased", [_http_input("x", X, "FP32", False)]).as_numpy(
                "y"
            ),
            "grpc-default": rpc.infer("biased", [_grpc_input("x", X, "FP32")]).as_numpy("y"),
            "http-given": http.infer(
                "biased",
                [_http_input("x", X, "FP32", True), _http_input("bias", other, "FP32", True)],
            ).as_numpy("y"),
            "grpc-given": rpc.infer(
                "biased", [_grpc_input("x", X, "FP32"), _grpc_input("bias", other, "FP32")]
            ).as_numpy("y"),
            "missing-required": _http_error(
                lambda: http.infer("biased", [_http_input("bias", other, "FP32", True)])
            ),
        }

    seen = await _both(repo, tmp_path, session)
    np.testing.assert_allclose(seen["http-default"], X + BIAS)
    np.testing.assert_allclose(seen["grpc-default"], X + BIAS)
    np.testing.assert_allclose(seen["http-given"], X + other)
    np.testing.assert_allclose(seen["grpc-given"], X + other)
    status, message = seen["missing-required"]
    assert status == "400"
    assert "needs input(s) x" in message


# ---------------------------------------------------------------------- file: load parameters


async def test_file_load_parameters_are_refused_by_name(repo: Path, tmp_path: Path) -> None:
    config = json.dumps({"name": "scores"})
    files = {"file:1/model.onnx": b"garbage, not a model"}

    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        return {
            "http": _http_error(lambda: http.load_model("scores", config=config, files=files)),
            "grpc": _grpc_error(lambda: rpc.load_model("scores", config=config, files=files)),
            "still": http.infer("scores", [_http_input("x", X, "FP32", True)]).as_numpy("probs"),
        }

    seen = await _both(repo, tmp_path, session)
    status, message = seen["http"]
    assert status == "400"
    assert "'file:1/model.onnx'" in message
    code, message = seen["grpc"]
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "'file:1/model.onnx'" in message
    np.testing.assert_array_equal(seen["still"], X)


# ---------------------------------------------------------------------- poll mode


async def test_poll_mode_metadata_drops_a_version_the_policy_dropped(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    write_manifest(root / "add" / "1")
    models = [{"name": "add", "path": "add", "preload": True}]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(root),
        model_control_mode="poll",
        poll_interval_s=0.1,
        poll_settle_s=0.2,
    )
    staging = tmp_path / "staging"
    build_add_onnx(staging / "model.onnx", 2.0)
    write_manifest(staging)
    async with running_server(cfg, grpc=True) as (app, client):
        before = (await client.get("/v2/models/add")).json()["versions"]
        shutil.copytree(staging, root / "add" / "2")
        for _ in range(100):
            if app.manager.resolve("add", None).key.version == "2":
                break
            await asyncio.sleep(0.1)
        rest = (await client.get("/v2/models/add")).json()["versions"]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            reply = await stub.ModelMetadata(pb.ModelMetadataRequest(name="add"))
    assert before == ["1"]
    assert rest == ["2"]
    assert list(reply.versions) == ["2"]


# ---------------------------------------------------------------------- logging extension


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    """The server changes the process's root logger (it runs in this process): undo it."""
    root = logging.getLogger()
    level, filters = root.level, {h: list(h.filters) for h in root.handlers}
    yield
    root.setLevel(level)
    for handler, kept in filters.items():
        handler.filters[:] = kept


@pytest.mark.usefixtures("root_logger_restored")
async def test_logging_extension_on_both_transports(repo: Path, tmp_path: Path) -> None:
    def session(http: thttp.InferenceServerClient, rpc: tgrpc.InferenceServerClient) -> Any:
        return {
            "before": http.get_log_settings(),
            "http-set": http.update_log_settings({"log_info": False, "log_verbose_level": 1}),
            "grpc-read": _ints(rpc.get_log_settings(as_json=True)),
            "grpc-set": _ints(rpc.update_log_settings({"log_format": "ISO8601"}, as_json=True)),
            "http-file": _http_error(lambda: http.update_log_settings({"log_file": "x.log"})),
            "grpc-file": _grpc_error(lambda: rpc.update_log_settings({"log_file": "x.log"})),
            "after": http.get_log_settings(),
        }

    seen = await _both(repo, tmp_path, session)
    assert seen["before"]["log_info"] is True
    assert seen["before"]["log_file"] == ""
    assert seen["http-set"]["log_info"] is False
    assert seen["http-set"]["log_verbose_level"] == 1
    assert seen["grpc-read"]["settings"]["log_verbose_level"] == {"uint32_param": 1}
    assert seen["grpc-set"]["settings"]["log_format"] == {"string_param": "ISO8601"}
    assert seen["http-file"][0] == "400"
    assert "'log_file'" in seen["http-file"][1]
    assert seen["grpc-file"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert seen["after"]["log_format"] == "ISO8601"
    assert seen["after"]["log_info"] is False
