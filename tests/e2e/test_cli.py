"""The `modelyard` CLI as a user runs it: build the example repository, serve, query."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from modelyard.config.settings import load_settings

IRIS = [5.1, 3.5, 1.4, 0.2]
"""The first iris flower (a setosa: class 0)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _modelyard(*args: str) -> list[str]:
    return [sys.executable, "-m", "modelyard.cli", *args]


@pytest.fixture(scope="module")
def example_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("example")
    out = subprocess.run(
        _modelyard("example", str(root), "--no-minilm"),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "modelyard.yaml" in out.stdout
    return root


@pytest.fixture(scope="module")
def server(example_repo: Path) -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen(
        _modelyard(
            "serve",
            "--config",
            str(example_repo / "modelyard.yaml"),
            "--http-port",
            str(port),
            "--grpc-port",
            str(_free_port()),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("server did not become ready in 120 s")
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("server did not stop within 30 s of SIGTERM")


def test_example_config_is_valid(example_repo: Path) -> None:
    settings = load_settings(example_repo / "modelyard.yaml")
    names = {m.name for m in settings.models}
    assert {"digits-logreg", "iris-logreg", "mlp-50mb", "identity"} <= names


def test_readme_curl_line_works(server: str) -> None:
    r = httpx.post(
        f"{server}/predict",
        json={"model": "iris-logreg", "inputs": {"input": [5.1, 3.5, 1.4, 0.2]}},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["outputs"]["label"] == [0]


def test_the_examples_cold_model_answers_its_first_request(server: str) -> None:
    # iris-skops loads on demand in about its timeout_ms (1000): the load does not count.
    r = httpx.post(
        f"{server}/v2/models/iris-skops/infer",
        json={"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP64", "data": IRIS}]},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    predict = next(o for o in r.json()["outputs"] if o["name"] == "predict")
    assert predict["data"] == [0]


def test_models_command_lists_states(server: str) -> None:
    out = subprocess.run(
        _modelyard("models", "--url", server),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "digits-logreg" in out.stdout
    assert "READY" in out.stdout


def test_bad_config_is_reported_with_file_and_field(tmp_path: Path) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("models:\n  - name: a\n    path: a\n    memory_mb: -3\n", encoding="utf-8")
    out = subprocess.run(
        _modelyard("serve", "--config", str(cfg)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert str(cfg) in out.stderr
    assert "models.0.memory_mb" in out.stderr


def test_manifest_and_keygen_commands(tmp_path: Path) -> None:
    from modelyard.examples.mlp import build_add_onnx
    from modelyard.repository.manifest import load_public_key, verify_manifest

    build_add_onnx(tmp_path / "m" / "1" / "model.onnx", 1.0)
    build_add_onnx(tmp_path / "m" / "2" / "model.onnx", 2.0)
    key = tmp_path / "signing.pem"
    subprocess.run(_modelyard("keygen", str(key)), check=True, capture_output=True, timeout=60)
    out = subprocess.run(
        _modelyard("manifest", str(tmp_path / "m"), "--key", str(key)),
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.count("modelyard-manifest.json") == 2
    public = load_public_key(str(tmp_path / "signing.pub.pem"))
    assert verify_manifest(tmp_path / "m" / "2", public_keys=[public], require=True)


def test_manifest_on_a_repository_root_asks_for_a_model_folder(tmp_path: Path) -> None:
    from modelyard.examples.mlp import build_add_onnx

    for name in ("a", "b"):
        build_add_onnx(tmp_path / name / "1" / "model.onnx", 1.0)
    out = subprocess.run(
        _modelyard("manifest", str(tmp_path)), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "is a model repository (model folders: a, b)" in out.stderr
    assert str(tmp_path / "a") in out.stderr
    assert not list(tmp_path.rglob("modelyard-manifest.json")), "wrote a manifest anyway"


def test_a_port_in_use_is_a_clear_error(example_repo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            _modelyard(
                "serve",
                "--config",
                str(example_repo / "modelyard.yaml"),
                "--http-port",
                str(port),
                "--grpc-port",
                str(_free_port()),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in out.stderr
    # Reported before the slow part of the start (fork server, workers, preloads).
    assert "worker memory limits" not in out.stderr


def test_a_missing_preloaded_model_folder_stops_serve_before_the_workers_start(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("models:\n  - {name: gone, path: gone, preload: true}\n", encoding="utf-8")
    out = subprocess.run(
        _modelyard("serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert f"{tmp_path / 'gone'} does not exist" in out.stderr
    assert "worker memory limits" not in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow  # a server process starting and stopping (3-8 s)
def test_a_grpc_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("models: []\n", encoding="utf-8")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            _modelyard("serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", str(port)),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1
    assert f"modelyard: cannot serve gRPC on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow  # a server process starting and stopping (3-8 s)
def test_a_preloaded_model_that_cannot_load_stops_serve_with_a_clear_message(
    tmp_path: Path,
) -> None:
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(
        "models:\n  - {name: broken, path: broken, preload: true, isolation: inline}\n",
        encoding="utf-8",
    )
    out = subprocess.run(
        _modelyard("serve", "--config", str(cfg), "--http-port", "0", "--grpc-port", "0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert f"{cfg}: models[0]: preload of broken:1" in out.stderr
    assert "exit_on_error: false" in out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def test_the_examples_text_generator_answers(server: str) -> None:
    pytest.importorskip("llama_cpp", reason="the llm extra serves the example GGUF models")
    r = httpx.post(
        f"{server}/v2/models/llama-tiny/generate",
        json={"text_input": "Hello world!", "parameters": {"max_tokens": 8, "temperature": 0}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["completion_tokens"] == 8
    assert r.json()["finish_reason"] == "length"
