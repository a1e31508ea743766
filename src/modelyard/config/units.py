"""One unit per kind in ``modelyard.yaml``, and the older names that still load.

Times are seconds (``_s``) and sizes are MiB (``_mb``), everywhere: model, device,
server and limit settings alike. Seconds because every server-level interval and every
internal deadline already was in seconds, and a float says half a millisecond as well
as ten minutes (``0.0005``, ``600``); MiB because that is what people write for memory
(``memory_mb: 200``), and a body limit is a size like any other.

Earlier releases named some fields in other units (``timeout_ms``,
``max_queue_delay_us``, ``max_request_bytes``). A file that still uses such a name loads
to the same value: the old name is converted to the new one before validation. Giving
both the old and the new name of one field is a mistake, reported as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MIB = 1024 * 1024
"""Bytes per MiB (a ``_mb`` field holds MiB)."""

OldName = tuple[str, float]
"""``(new field name, how many old units make one new unit)``."""


def from_old_names(data: Any, old_names: Mapping[str, OldName]) -> Any:
    """``data`` (a model's raw input) with every old field name replaced by the new one.

    A number is divided into the new unit (``timeout_ms: 1500`` → ``timeout_s: 1.5``);
    anything else is passed on under the new name for validation to judge. Dividing by
    a power of ten or two is correctly rounded, so ``max_queue_delay_us: 500`` and
    ``max_queue_delay_s: 0.0005`` load to the same float.
    """
    if not isinstance(data, Mapping) or not any(old in data for old in old_names):
        return data
    out = dict(data)
    for old, (new, per_new_unit) in old_names.items():
        if old not in out:
            continue
        if new in out:
            raise ValueError(f"give {new!r} or its older name {old!r}, not both")
        value = out.pop(old)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = value / per_new_unit
        out[new] = value
    return out
