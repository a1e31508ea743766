"""TLS and mutual TLS on both front ends, with certificates made in the test by trustme."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
import trustme

from modelyard.app import App, StartupError
from modelyard.config.settings import load_settings
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2 as pb
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from tests.security._pki import Pki, channel_credentials, client_context, make_pki
from tests.servers import started_app, write_config

MODELS = [{"name": "add", "path": "add", "preload": True, "isolation": "inline"}]
INFER_BODY = {
    "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0, 1, 2, 3]}]
}
_SHORT_S = 5.0


@contextlib.asynccontextmanager
async def tls_server(
    model_root: Path, tmp_path: Path, pki: Pki, *, mutual: bool
) -> AsyncIterator[App]:
    security = {"tls_certfile": "cert.pem", "tls_keyfile": "key.pem"}  # relative to the YAML
    if mutual:
        security["tls_client_ca_file"] = str(pki.ca_file)
    cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
    async with started_app(cfg) as app:
        yield app


def _stub(channel: grpc.aio.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]  # generated


async def _https_works(app: App, context: ssl.SSLContext) -> None:
    async with httpx.AsyncClient(
        base_url=f"https://127.0.0.1:{app.http_port}", verify=context, timeout=_SHORT_S
    ) as client:
        assert (await client.get("/v2/health/ready")).status_code == 200
        r = await client.post("/v2/models/add/infer", json=INFER_BODY)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]


async def _grpc_live(target: str, credentials: grpc.ChannelCredentials | None) -> bool:
    channel = (
        grpc.aio.insecure_channel(target)
        if credentials is None
        else grpc.aio.secure_channel(target, credentials)
    )
    async with channel:
        response = await _stub(channel).ServerLive(pb.ServerLiveRequest(), timeout=_SHORT_S)
    return bool(response.live)


async def test_https_and_grpc_over_tls(model_root: Path, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with tls_server(model_root, tmp_path, pki, mutual=False) as app:
        target = f"127.0.0.1:{app.grpc_port}"
        await _https_works(app, client_context(pki, with_cert=False))
        assert await _grpc_live(target, channel_credentials(pki, with_cert=False))
        # Plaintext to either TLS port gets nothing served.
        async with httpx.AsyncClient(timeout=_SHORT_S) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{app.http_port}/v2/health/ready")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _grpc_live(target, None)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        # A client that does not trust the CA refuses the server.
        async with httpx.AsyncClient(timeout=_SHORT_S) as untrusting:
            with pytest.raises(httpx.ConnectError):
                await untrusting.get(f"https://127.0.0.1:{app.http_port}/v2/health/ready")
        # The server kept serving through all of that.
        await _https_works(app, client_context(pki, with_cert=False))


async def test_mutual_tls(model_root: Path, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    async with tls_server(model_root, tmp_path, pki, mutual=True) as app:
        target = f"127.0.0.1:{app.grpc_port}"
        async with httpx.AsyncClient(
            verify=client_context(pki, with_cert=False), timeout=_SHORT_S
        ) as anonymous:
            with pytest.raises(httpx.TransportError):
                await anonymous.get(f"https://127.0.0.1:{app.http_port}/v2/health/ready")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _grpc_live(target, channel_credentials(pki, with_cert=False))
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        # A client certificate from another CA is refused too.
        stranger = trustme.CA().issue_cert("stranger@elsewhere.test")
        context = client_context(pki, with_cert=False)
        stranger.configure_cert(context)
        async with httpx.AsyncClient(verify=context, timeout=_SHORT_S) as impostor:
            with pytest.raises(httpx.TransportError):
                await impostor.get(f"https://127.0.0.1:{app.http_port}/v2/health/ready")
        await _https_works(app, client_context(pki, with_cert=True))
        assert await _grpc_live(target, channel_credentials(pki, with_cert=True))


async def test_unusable_certificate_stops_start(model_root: Path, tmp_path: Path) -> None:
    make_pki(tmp_path)  # cert.pem and key.pem, which two of the cases name
    other_key = tmp_path / "other-key.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    for security, fragment in [
        ({"tls_certfile": "missing.pem", "tls_keyfile": "key.pem"}, "security.tls_certfile"),
        ({"tls_certfile": "cert.pem", "tls_keyfile": str(other_key)}, "security.tls_certfile"),
        (
            {"tls_certfile": "cert.pem", "tls_keyfile": "key.pem", "tls_client_ca_file": "x"},
            "security.tls_client_ca_file",
        ),
    ]:
        cfg = write_config(tmp_path, MODELS, model_repository=str(model_root), security=security)
        app = App(load_settings(cfg, host="127.0.0.1", http_port=0, grpc_port=0))
        with pytest.raises(StartupError, match=fragment):
            await app.start()
        assert app.http_port is None
