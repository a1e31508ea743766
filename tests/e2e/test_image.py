"""The container image is its scripts: the Dockerfile installs with scripts/install.sh,
starts with scripts/serve.sh and checks health with scripts/healthcheck.sh, as a user
other than root, and those scripts work under the Dockerfile's own environment.

No docker daemon is needed: the Dockerfile is read, and its start and health steps are
run here on this interpreter's environment (scripts/check_image.sh, which CI runs, does
the install step too)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modelyard.examples.mlp import build_add_onnx
from tests.servers import write_config

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            found.append((word.upper(), rest.strip()))
    return found


def _one(name: str) -> str:
    values = [rest for word, rest in _instructions() if word == name]
    assert len(values) == 1, f"Dockerfile: expected one {name}, found {values}"
    return values[0]


def _image_env() -> dict[str, str]:
    words = shlex.split(_one("ENV"))
    return dict(w.split("=", 1) for w in words)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_the_dockerfile_runs_the_tested_scripts_as_a_plain_user() -> None:
    runs = [rest for word, rest in _instructions() if word == "RUN"]
    install = [r for r in runs if "scripts/install.sh" in r]
    assert len(install) == 1, runs
    assert 'EXTRAS="$EXTRAS"' in install[0]
    assert "EDITABLE=0" in install[0]
    assert "ARG" in {w for w, _ in _instructions()}
    assert any(rest.startswith("EXTRAS=") for w, rest in _instructions() if w == "ARG")
    user = _one("USER")
    assert user not in ("root", "0"), "the image must not run as root"
    assert f"useradd --system --create-home --uid 10001 {user}" in " ".join(runs)
    assert _one("ENTRYPOINT") == '["bash", "scripts/serve.sh"]'
    assert _one("HEALTHCHECK").endswith('CMD ["bash", "scripts/healthcheck.sh"]')
    env = _image_env()
    assert env["VENV"] in install[0], "ENV VENV must name the environment the RUN installs"
    # The scripts the image copies are the ones CI runs.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/check_image.sh" in ci
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "scripts/install.sh" in setup


def _healthy(env: dict[str, str]) -> bool:
    check = subprocess.run(
        ["bash", "scripts/healthcheck.sh"], cwd=ROOT, env=env, capture_output=True, timeout=30
    )
    return check.returncode == 0


@pytest.mark.slow  # a server process starting and stopping (3-8 s)
@pytest.mark.timeout(300)
def test_serve_and_healthcheck_scripts_under_the_images_environment(tmp_path: Path) -> None:
    build_add_onnx(tmp_path / "add" / "1" / "model.onnx", 1.0)
    config = write_config(tmp_path, [{"name": "add", "path": "add", "preload": True}])
    env = {
        **os.environ,
        **_image_env(),
        # The image's settings, on loopback and a free port for the test, with the token
        # a non-loopback bind would need.
        "VENV": sys.prefix,
        "MODELYARD_HOST": "127.0.0.1",
        "MODELYARD_HTTP_PORT": str(_free_port()),
        "MODELYARD_GRPC_PORT": "off",
        "MODELYARD_SECURITY__MANAGEMENT_TOKEN": "t" * 32,
    }
    assert not _healthy(env), "something already answers on the test's port"
    cmd = shlex.split(_one("CMD").strip("[]").replace(",", " "))
    assert cmd == ["--config", "/models/modelyard.yaml"]
    proc = subprocess.Popen(
        ["bash", "scripts/serve.sh", "--config", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while not _healthy(env):
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "never healthy"
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out.decode()
    # MODELYARD_LOG_FORMAT=json from the Dockerfile reached the server.
    assert b'"message"' in out or b'"msg"' in out, out.decode()
