"""What to send where: the models to benchmark and their input metadata, asked of the server.

Runs once before the first phase, so it favours clear errors over speed.
"""

from __future__ import annotations

import ssl
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from modelyard.bench.client import Endpoint
from modelyard.bench.errors import TargetError
from modelyard.bench.payload import ModelMetadata


@dataclass(frozen=True)
class Discovery:
    """The models a benchmark will send to, and the metadata of those it must generate for."""

    models: tuple[str, ...]
    metadata: Mapping[str, ModelMetadata]


async def discover_rest(
    endpoint: Endpoint,
    models: Sequence[str],
    *,
    skip_metadata: Collection[str] = (),
    timeout_s: float = 10.0,
    headers: Mapping[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Discovery:
    """Resolve ``models`` (empty: every READY model) and fetch metadata for each one.

    The model list comes from ``POST /v2/repository/index`` (READY entries only), falling back
    to ``GET /v2/models`` for servers without the repository extension. Models in
    ``skip_metadata`` have a user-supplied payload and need no metadata. ``headers``
    (the token) go with every request; ``ssl_context`` says which CA to trust.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        timeout=timeout,
        headers=dict(headers or {}),
        connector=aiohttp.TCPConnector(ssl=ssl_context or True),
    ) as http:
        names = tuple(models) or await _ready_models(http, endpoint)
        if not names:
            raise TargetError(f"{endpoint.url('')} reports no READY models; pass --models")
        metadata = {}
        for name in names:
            if name in skip_metadata:
                continue
            status, body = await _call(
                http, "GET", endpoint.url(f"/v2/models/{quote(name, safe='')}")
            )
            if status != 200 or not isinstance(body, dict):
                raise TargetError(f"metadata of model {name!r}: HTTP {status} {_reason(body)}")
            metadata[name] = ModelMetadata.from_json(body)
    return Discovery(models=names, metadata=metadata)


async def _ready_models(http: aiohttp.ClientSession, endpoint: Endpoint) -> tuple[str, ...]:
    status, body = await _call(http, "POST", endpoint.url("/v2/repository/index"), b"{}")
    if status == 200 and isinstance(body, list):
        return tuple(
            str(entry["name"])
            for entry in body
            if isinstance(entry, dict)
            and "name" in entry
            and str(entry.get("state", "READY")).upper() == "READY"
        )
    status, body = await _call(http, "GET", endpoint.url("/v2/models"))
    if isinstance(body, dict):
        body = body.get("models")
    if status == 200 and isinstance(body, list):
        return tuple(str(e["name"]) if isinstance(e, dict) else str(e) for e in body)
    raise TargetError(
        f"{endpoint.url('')} has neither POST /v2/repository/index nor GET /v2/models "
        f"(HTTP {status} {_reason(body)}); pass --models"
    )


async def _call(
    http: aiohttp.ClientSession, method: str, url: str, data: bytes | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} if data is not None else None
    try:
        async with http.request(method, url, data=data, headers=headers) as response:
            raw = await response.read()
            status = response.status
    except TimeoutError:
        raise TargetError(f"{method} {url}: no answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise TargetError(f"cannot reach {url}: {exc}") from exc
    try:
        return status, orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return status, raw[:200].decode("utf-8", "replace")


def _reason(body: Any) -> str:
    if isinstance(body, dict) and "error" in body:
        return str(body["error"])
    return "" if body is None else f"{body!s:.200}"
