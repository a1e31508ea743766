"""Settings for the manager's unit tests: models served from empty version folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings


def folder_settings(
    root: Path, devices: list[DeviceConfig], models: dict[str, dict[str, Any]]
) -> ServerSettings:
    """``models`` (name → config fields) on ``devices``, each with a version 1 folder
    under ``root`` (fake instances load nothing from it)."""
    for name in models:
        (root / name / "1").mkdir(parents=True)
    return ServerSettings(
        model_repository=str(root),
        devices=devices,
        models=[ModelConfig(name=n, path=n, **fields) for n, fields in models.items()],
    )
