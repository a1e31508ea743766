"""The README walked through as a new user would, after its set-up command.

The server is started the README's way, ``./scripts/serve-example.sh``, on the bundled
example (with ``SKIP_INSTALL=1`` and ``VENV`` naming this interpreter's environment, since
the set-up is done, and on free ports rather than 8080). Then every ``curl`` and
``modelyard`` command of the README's code blocks is read out of README.md and run as
written, with ``modelyard`` from that environment's ``bin`` (what
``source .venv/bin/activate`` gives) and only the port changed; each answer is checked.
``curl`` lines are sent with httpx (their ``-X``, ``-H`` and ``-d`` read with shlex), so
the test needs no curl binary.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelyard.examples.minilm import minilm_available

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_PORT = 8080
VENV_BIN = Path(sys.prefix) / "bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def readme_commands(text: str) -> list[str]:
    """Every ``curl …`` and ``modelyard …`` line of the README's bash blocks, with
    backslash continuations joined and trailing comments dropped."""
    commands: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] in ("curl", "modelyard"):
                commands.append(shlex.join(words))
    return commands


@dataclass(frozen=True)
class Curl:
    """One curl command line, as httpx sends it."""

    method: str
    url: str
    headers: dict[str, str]
    body: str | None


def parse_curl(command: str, port: int) -> Curl:
    """Read ``curl -s -X M URL -H 'k: v' -d DATA`` (the forms the README uses)."""
    words = shlex.split(command)[1:]
    method, url, headers, body = "", "", {}, None
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-s":
            i += 1
            continue
        if word in ("-X", "-H", "-d"):
            value = words[i + 1]
            if word == "-X":
                method = value
            elif word == "-H":
                key, _, val = value.partition(":")
                headers[key.strip()] = val.strip()
            else:
                body = value
            i += 2
            continue
        assert not word.startswith("-"), f"README curl option the test cannot read: {word}"
        url = word
        i += 1
    url = url.replace(f"localhost:{README_PORT}", f"127.0.0.1:{port}")
    if not url.startswith("http"):
        url = f"http://{url}"
    return Curl(method or ("POST" if body is not None else "GET"), url, headers, body)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    assert (VENV_BIN / "modelyard").exists(), (
        f"no modelyard console script in {VENV_BIN}: the set-up command installs it"
    )
    port = _free_port()
    env = {
        **os.environ,
        "SKIP_INSTALL": "1",
        "VENV": sys.prefix,
        "EXAMPLE_DIR": str(tmp_path_factory.mktemp("readme") / "example-repo"),
        # gRPC off from the environment: the README's examples are REST and CLI only.
        "MODELYARD_GRPC_PORT": "off",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path_factory.mktemp("readme-log") / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["./scripts/serve-example.sh", "--http-port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready in 300 s:\n{log.read_text()}"
            time.sleep(0.2)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    serving = [line for line in text.splitlines() if "modelyard serving" in line]
    assert serving, text
    assert "grpc" not in serving[0], "MODELYARD_GRPC_PORT=off did not turn gRPC off"
    assert text.count("has no manifest") == 1, text
    # Logs, not a terminal: no progress bars (tqdm's "50%|█████     |" and pip's).
    assert not re.search(r"\d+%\||[█━]", text), text
    assert "deprecat" not in text.lower(), text


def _check_curl(command: str, response: httpx.Response) -> None:
    """What each README curl line must answer."""
    assert response.status_code == 200, f"{command}\n{response.status_code} {response.text}"
    if "/load" in command:
        assert response.content == b""
        return
    body: Any = response.json()
    if '"model": "iris-logreg"' in command:  # the /predict of "Two commands"
        assert body["outputs"]["label"] == [0]
    elif "/v2/models/iris-logreg/infer" in command:
        label = next(o for o in body["outputs"] if o["name"] == "label")
        assert label["data"] == [0]
    elif command.endswith("/v2/models/digits-logreg"):
        assert body["name"] == "digits-logreg"
        assert [i["name"] for i in body["inputs"]] == ["input"]
    elif "/v2/repository/index" in command:
        states = {row["name"]: row["state"] for row in body}
        assert states["iris-logreg"] == "READY"
    elif "minilm-text" in command:
        embedding = body["outputs"]["embedding"]
        assert len(embedding[0]) == 384
        assert body["outputs"]["tokens"][0] > 0  # "hello world": at least its two words
    else:
        pytest.fail(f"README curl line with no expected answer here: {command}")


def test_readme_commands_are_found() -> None:
    commands = readme_commands(README.read_text(encoding="utf-8"))
    assert sum(c.startswith("curl") for c in commands) >= 6, commands
    assert any(c.startswith("modelyard models") for c in commands), commands


@pytest.mark.slow  # builds the example repository (MiniLM too with the torch extra)
@pytest.mark.timeout(600)
def test_every_readme_command_answers_as_documented(server: int) -> None:
    port = server
    commands = readme_commands(README.read_text(encoding="utf-8"))
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    loaded = False
    for command in commands:
        if command.startswith("curl"):
            if "minilm-text" in command and not minilm_available():
                continue  # the README marks it: needs the torch extra, absent here
            curl = parse_curl(command, port)
            response = httpx.request(
                curl.method,
                curl.url,
                headers=curl.headers,
                content=curl.body.encode() if curl.body is not None else None,
                timeout=120,
            )
            _check_curl(command, response)
            loaded = loaded or "/mlp-50mb/load" in command
        else:
            words = [
                w.replace(f"127.0.0.1:{README_PORT}", f"127.0.0.1:{port}")
                for w in shlex.split(command)
            ]
            out = subprocess.run(words, env=env, capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, f"{command}\n{out.stderr}"
            if words[1] == "models":
                rows = {line.split()[0]: line.split()[2] for line in out.stdout.splitlines()[1:]}
                assert rows["digits-logreg"] == "READY", out.stdout
                # On demand: loaded only once the README's load line has run.
                assert rows["mlp-50mb"] == ("READY" if loaded else "UNLOADED"), out.stdout


def test_parse_curl_reads_the_readme_forms() -> None:
    curl = parse_curl(
        "curl -s -X POST localhost:8080/predict -H 'content-type: application/json' "
        """-d '{"model": "m"}'""",
        9999,
    )
    assert curl == Curl(
        "POST",
        "http://127.0.0.1:9999/predict",
        {"content-type": "application/json"},
        json.dumps({"model": "m"}),
    )
