"""The server runs without the ``bench`` extra (aiohttp): only ``modelyard bench`` needs it,
and says so."""

from __future__ import annotations

import subprocess
import sys

import pytest

_WITHOUT_AIOHTTP = """
import sys
sys.modules["aiohttp"] = None  # any import of it now raises ImportError
import modelyard.app, modelyard.frontends.http.app, modelyard.frontends.grpc.server
from modelyard.cli import build_parser, main
sub = next(a for a in build_parser()._actions if a.dest == "command")
print(sorted(sub.choices))
print("exit", main(["bench", "--url", "http://127.0.0.1:1"]))
"""


@pytest.mark.slow  # a fresh interpreter importing the whole server: seconds
def test_the_server_and_cli_import_without_aiohttp() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_AIOHTTP], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    verbs = done.stdout
    assert "'serve'" in verbs
    # Listed, and without its extra it says which extra brings it (not "invalid choice").
    assert "'bench'" in verbs
    assert "exit 2" in verbs
    assert "needs the bench extra" in done.stderr
    assert "pip install 'modelyard[bench]'" in done.stderr


_WITHOUT_RAY = """
import asyncio, sys
sys.modules["ray"] = None  # any import of it now raises ImportError
import modelyard.app, modelyard.cli
from modelyard.config.settings import ServerSettings
from modelyard.ray_app import StartupError, make_app
app = make_app(ServerSettings(ray={"address": "auto"}, http_port=0))
try:
    asyncio.run(app.start())
except StartupError as exc:
    print(exc)
"""


@pytest.mark.slow  # a fresh interpreter importing the whole server: seconds
def test_the_server_imports_without_ray_and_ray_mode_names_the_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_RAY], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "needs the 'ray' extra" in done.stdout
