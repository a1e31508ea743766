"""Start real servers for tests through the same App the CLI uses; build real models."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings


def write_config(root: Path, models: Sequence[Any], **server: Any) -> Path:
    """Write ``root/modelyard.yaml`` with ``models`` and server-level fields."""
    doc: dict[str, Any] = {"model_repository": ".", "models": [dict(m) for m in models]}
    doc.update(server)
    path = root / "modelyard.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def running_server(
    config_file: Path, *, grpc: bool = False, **overrides: Any
) -> AsyncIterator[tuple[App, httpx.AsyncClient]]:
    """An App on 127.0.0.1 with ephemeral ports, and an HTTP client pointed at it."""
    settings = load_settings(
        config_file,
        host="127.0.0.1",
        http_port=0,
        grpc_port=0 if grpc else None,
        **overrides,
    )
    # load_settings ignores None overrides; grpc_port=None must really disable gRPC.
    if not grpc and settings.grpc_port is not None:
        settings = settings.model_copy(update={"grpc_port": None})
    app = App(settings)
    await app.start()
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{app.http_port}", timeout=30
        ) as client:
            yield app, client
    finally:
        await app.stop()
