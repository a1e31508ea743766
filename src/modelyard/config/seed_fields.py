"""The design notes' server fields, read as the modelyard fields they mean (aliases).

The notes this project grew from start their server with ``device_id``,
``max_total_memory_mb`` and ``model_config_path`` (see docs/seeds.md). A file that uses
them loads, each mapped onto the one modelyard field that does the same job:

* ``model_config_path: models.yaml``: the models come from that file (its ``models:``
  list, or a bare list), relative to the server file's folder; they are added to the
  server file's own ``models:``;
* ``device_id: N``: models that name no ``device``/``devices`` are placed on the N-th
  entry of ``devices:`` (0: the first; with the default ``devices: [cpu]``, the CPU);
* ``max_total_memory_mb: M``: that device's ``memory_budget_mb`` (a device that already
  sets one is a conflict, reported as such).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

SEED_FIELDS = ("device_id", "max_total_memory_mb", "model_config_path")
"""The notes' server-level field names accepted as aliases."""


def _read_models(path: Path) -> list[Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"model_config_path {str(path)!r}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"model_config_path {str(path)!r}: not valid YAML: {exc}") from None
    models = loaded.get("models") if isinstance(loaded, Mapping) else loaded
    if models is None:
        return []
    if not isinstance(models, list):
        raise ValueError(f"model_config_path {str(path)!r}: expected a 'models:' list")
    return models


def _device_index(value: Any, devices: list[Any]) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"device_id must be a whole number >= 0, not {value!r}")
    if value >= len(devices):
        raise ValueError(
            f"device_id {value}: only {len(devices)} device(s) configured in 'devices:'"
        )
    return value


def _device_name(device: Any) -> str:
    if isinstance(device, Mapping):
        return str(device.get("name", ""))
    return str(getattr(device, "name", device))


def _with_budget(device: Any, budget: Any) -> dict[str, Any]:
    fields = dict(device) if isinstance(device, Mapping) else {"name": _device_name(device)}
    if fields.get("memory_budget_mb") is not None:
        raise ValueError(
            f"give max_total_memory_mb or devices[{fields['name']!r}].memory_budget_mb, not both"
        )
    fields["memory_budget_mb"] = budget
    return fields


def apply_seed_fields(data: Any) -> Any:
    """``data`` (the server's raw settings) with the notes' fields turned into ours."""
    if not isinstance(data, Mapping) or not any(k in data for k in SEED_FIELDS):
        return data
    out = dict(data)
    models = list(out.get("models") or [])
    config_path = out.pop("model_config_path", None)
    if config_path is not None:
        path = Path(str(config_path))
        if not path.is_absolute():
            path = Path(str(out.get("config_dir", "."))) / path
        models += _read_models(path)
    devices = list(out.get("devices") or [{"name": "cpu"}])
    device_id = out.pop("device_id", None)
    index = 0 if device_id is None else _device_index(device_id, devices)
    if device_id is not None:
        name = _device_name(devices[index])
        models = [
            {**m, "device": name}
            if isinstance(m, Mapping) and "device" not in m and "devices" not in m
            else m
            for m in models
        ]
    budget = out.pop("max_total_memory_mb", None)
    if budget is not None:
        devices[index] = _with_budget(devices[index], budget)
        out["devices"] = devices
    out["models"] = models
    return out
