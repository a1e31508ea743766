"""The gate for load requests that arrive over the API: a closed repository.

A load request names a model and may carry a ``config`` of model fields. Whatever it
names must stay inside the repository (paths resolved, symlinks followed), and it may
set only the fields that tune serving; every field that would run code, trust files,
share the server's process, hold memory for good or outrank the operator's models is
refused unless ``remote_load:`` in the YAML allows it. Paths in the operator's own YAML
are not checked here: they may point anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelyard.config.model_config import ModelConfig
from modelyard.config.remote_load import RemoteLoadConfig
from modelyard.errors import InvalidInputError

TUNING_FIELDS = frozenset(
    {
        "runtime",  # onnx, sklearn, torch; python only with allow_code
        "memory_mb",
        "memory_limit_mb",
        "preload",
        "max_batch_size",
        "max_queue_delay_s",
        "max_queue_delay_us",  # the older names of the same fields (config/units.py)
        "preferred_batch_sizes",
        "latency_slo_s",
        "latency_slo_ms",
        "max_queue_size",
        "timeout_s",
        "timeout_ms",
        "load_timeout_s",
        "load_timeout_ms",
        "share_weights",
        "intra_op_threads",
        "device",
        "devices",  # among the devices the operator configured (the registry checks)
        "breaker",
        "version_policy",
        "default_version",
    }
)
"""Fields a remote config may always set: they change how a model is served, not what
runs. A field added to ModelConfig later is refused until it is listed here."""

REMOTE_MAX_THREADS = os.cpu_count() or 1
"""Most intra-op threads a remote config may ask for: one per core of the host."""
REMOTE_MAX_QUEUE = 65_536
"""Largest queue a remote config may ask for (the YAML may set any size)."""

GATED_FIELDS = frozenset(
    {"name", "path", "priority", "pinned", "trusted", "isolation", "class", "python_class"}
    | {"options", "warmup_inputs"}
)
"""Fields a remote config may set only within what ``remote_load:`` allows."""


def shown_path(root: Path, path: Path) -> str:
    """``path`` as an error message may show it: relative to the repository root.

    A folder outside the repository (the operator's YAML may name one) shows as its
    last component only, so a client never learns the server's layout.
    """
    try:
        relative = path.relative_to(root)
    except ValueError:
        return f"<outside the repository>/{path.name}"
    return str(relative) if str(relative) != "." else "<repository root>"


def folder_in_repository(root: Path, relative: str, what: str) -> Path:
    """``root / relative`` resolved, symlinks followed; InvalidInputError if it leaves ``root``.

    ``root`` must already be resolved. Absolute paths are refused outright.
    """
    candidate = Path(relative)
    if candidate.is_absolute():
        raise InvalidInputError(
            f"{what}: absolute paths are not allowed in a load request; "
            "name a folder relative to the model repository"
        )
    try:
        resolved = (root / candidate).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
        raise InvalidInputError(f"{what}: cannot be resolved ({type(exc).__name__})") from None
    if resolved == root or not resolved.is_relative_to(root):
        raise InvalidInputError(
            f"{what}: {relative[:80]!r} resolves outside the model repository "
            "(folders and symlinks must stay inside it)"
        )
    return resolved


def check_fields(name: str, fields: Mapping[str, Any], policy: RemoteLoadConfig) -> None:
    """Refuse a remote config's fields that are neither tuning nor gated (before validation)."""
    unknown = sorted(k for k in fields if k not in TUNING_FIELDS and k not in GATED_FIELDS)
    if unknown:
        raise InvalidInputError(
            f"config for model {name!r}: field(s) {', '.join(map(str, unknown))[:200]} "
            "cannot be set by a load request"
        )


def check_config(
    config: ModelConfig, folder: Path, own_folder: Path, policy: RemoteLoadConfig
) -> None:
    """Refuse what a validated remote config asks beyond what ``policy`` allows."""
    refused: list[str] = []
    if (config.runtime == "python" or config.python_class) and not policy.allow_code:
        refused.append("'runtime: python' and 'class' (remote_load.allow_code)")
    if config.trusted and not policy.allow_trusted:
        refused.append("'trusted: true' (remote_load.allow_trusted)")
    if config.isolation == "inline" and not policy.allow_inline:
        refused.append("'isolation: inline' (remote_load.allow_inline)")
    if config.pinned and not policy.allow_pinned:
        refused.append("'pinned: true' (remote_load.allow_pinned)")
    if (config.options or config.warmup_inputs) and not policy.allow_runtime_options:
        refused.append("'options' and 'warmup_inputs' (remote_load.allow_runtime_options)")
    if config.priority < policy.min_priority:
        refused.append(
            f"'priority: {config.priority}' (more important than {policy.min_priority}, "
            "remote_load.min_priority)"
        )
    # Tuning fields stay tuning: a remote config may not size a queue or a thread pool
    # so large that one load request exhausts the host's memory or threads.
    if config.intra_op_threads > REMOTE_MAX_THREADS:
        refused.append(f"'intra_op_threads' over {REMOTE_MAX_THREADS} (the host's cores)")
    if config.max_queue_size > REMOTE_MAX_QUEUE:
        refused.append(f"'max_queue_size' over {REMOTE_MAX_QUEUE}")
    if not folder.is_relative_to(own_folder) and not policy.allow_other_folder:
        refused.append(
            "a 'path' other than the model's own folder (remote_load.allow_other_folder)"
        )
    if refused:
        raise InvalidInputError(
            f"load request for model {config.name!r} refused: it asks for "
            f"{'; '.join(refused)}, which this server does not allow over the API"
        )
