"""The client verbs (``models``, ``alias``, ``rollback``, ``bench``) send the token and
trust a CA, against real servers with tokens (and TLS)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from modelyard.app import App
from modelyard.bench import BenchConfig, run_bench
from modelyard.bench.errors import TargetError
from modelyard.cli import main
from tests.security._pki import make_pki
from tests.servers import started_app, write_config

# Each test starts a server and runs the client verbs several times: over ~2 s.
pytestmark = pytest.mark.slow

MANAGEMENT = "mgmt-" + secrets.token_urlsafe(24)
DATA = "data-" + secrets.token_urlsafe(24)
MODELS = [
    {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
]


@contextlib.asynccontextmanager
async def guarded_server(model_root: Path, tmp_path: Path, *, tls: bool) -> AsyncIterator[App]:
    security: dict[str, object] = {"management_token": MANAGEMENT, "data_token": DATA}
    if tls:
        make_pki(tmp_path)
        security |= {"tls_certfile": "cert.pem", "tls_keyfile": "key.pem"}
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    async with started_app(cfg) as app:
        yield app


async def _cli(*argv: str) -> int:
    # The verbs use a blocking client; off the loop, so the server keeps answering.
    return await asyncio.to_thread(main, list(argv))


async def test_cli_verbs_send_the_token(
    model_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("MODELYARD_TOKEN", raising=False)
    async with guarded_server(model_root, tmp_path, tls=False) as app:
        url = f"http://127.0.0.1:{app.http_port}"
        assert await _cli("models", "--url", url) == 1
        err = capsys.readouterr().err
        assert "HTTP 401" in err
        assert "--token" in err
        assert "MODELYARD_TOKEN" in err
        assert await _cli("models", "--url", url, "--token", DATA) == 1
        assert "HTTP 403" in capsys.readouterr().err
        assert await _cli("models", "--url", url, "--token", MANAGEMENT) == 0
        assert "add" in capsys.readouterr().out

        monkeypatch.setenv("MODELYARD_TOKEN", MANAGEMENT)
        assert await _cli("alias", "add", "default", "1", "--url", url) == 0
        assert await _cli("alias", "add", "default", "2", "--url", url) == 0
        assert await _cli("rollback", "add", "--url", url) == 0
        assert '"1"' in capsys.readouterr().out.splitlines()[-1]
        # The flag wins over the environment.
        assert await _cli("rollback", "add", "--url", url, "--token", "not-it") == 1
        assert "HTTP 403" in capsys.readouterr().err


async def test_cli_over_https_with_cacert(
    model_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MODELYARD_TOKEN", MANAGEMENT)
    async with guarded_server(model_root, tmp_path, tls=True) as app:
        url = f"https://127.0.0.1:{app.http_port}"
        assert await _cli("models", "--url", url) == 1  # the CA is not trusted
        assert "cannot reach" in capsys.readouterr().err
        assert await _cli("models", "--url", url, "--cacert", str(tmp_path / "ca.pem")) == 0
        assert "add" in capsys.readouterr().out


async def test_bench_sends_the_token(model_root: Path, tmp_path: Path) -> None:
    async with guarded_server(model_root, tmp_path, tls=False) as app:
        base = {
            "url": f"http://127.0.0.1:{app.http_port}",
            "models": ("add",),
            "warmup_s": 0.0,
            "requests": 20,
            "concurrency": (2,),
        }
        # Without the token every request is refused, and the results say so.
        with pytest.raises(TargetError, match="401"):
            await run_bench(BenchConfig(**base))
        for client in ("raw", "aiohttp"):
            [result] = await run_bench(BenchConfig(**base, token=DATA, http_client=client))
            assert (result.requests, result.ok, result.errors) == (20, 20, {}), client
        grpc_target = f"127.0.0.1:{app.grpc_port}"
        [result] = await run_bench(BenchConfig(**base, grpc_target=grpc_target, token=DATA))
        assert (result.ok, result.errors) == (20, {})
        # Discovery through the repository index needs the management token.
        [result] = await run_bench(BenchConfig(**(base | {"models": ()}), token=MANAGEMENT))
        assert result.ok == 20


async def test_bench_over_tls_with_cacert(model_root: Path, tmp_path: Path) -> None:
    async with guarded_server(model_root, tmp_path, tls=True) as app:
        common = {
            "models": ("add",),
            "warmup_s": 0.0,
            "requests": 20,
            "concurrency": (2,),
            "token": DATA,
            "ca_file": tmp_path / "ca.pem",
        }
        config = BenchConfig(
            url=f"https://127.0.0.1:{app.http_port}", http_client="aiohttp", **common
        )
        [result] = await run_bench(config)
        assert (result.ok, result.errors) == (20, {})
        config = BenchConfig(grpc_target=f"127.0.0.1:{app.grpc_port}", **common)
        [result] = await run_bench(config)
        assert (result.ok, result.errors) == (20, {})
        # The token never lands in what bench writes out.
        assert DATA not in config.model_dump_json()
