"""Settings for the manager's unit tests: models served from empty version folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings


def folder_settings(
    root: Path,
    devices: list[DeviceConfig],
    models: dict[str, dict[str, Any]],
    weights_bytes: int = 0,
    **server: Any,
) -> ServerSettings:
    """``models`` (name → config fields) on ``devices``, each with a version 1 folder
    under ``root`` (fake instances load nothing from it), holding a ``model.onnx`` of
    ``weights_bytes`` when that is set (a file for the budget to charge); ``server``:
    further :class:`ServerSettings` fields."""
    for name in models:
        (root / name / "1").mkdir(parents=True)
        if weights_bytes:
            (root / name / "1" / "model.onnx").write_bytes(b"x" * weights_bytes)
    return ServerSettings(
        model_repository=str(root),
        devices=devices,
        models=[ModelConfig(name=n, path=n, **fields) for n, fields in models.items()],
        **server,
    )
