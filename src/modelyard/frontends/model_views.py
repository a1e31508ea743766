"""Read-only views of the repository for the protocol: the versions model metadata
lists, Triton's per-version statistics, and the repository index."""

from __future__ import annotations

from typing import Any

from modelyard.errors import hide_paths
from modelyard.protocol.names import check_model_name, check_version_name
from modelyard.repository.layout import apply_policy
from modelyard.repository.version_labels import order_key, sort_versions
from modelyard.service.model_service import ModelService
from modelyard.service.views import ModelState, ServedModel, ServedVersion


def listed_versions(entry: ServedModel) -> tuple[str, ...]:
    """The versions model metadata lists: those the version policy serves among the
    known ones, plus any an alias routes to (a version the policy dropped is left out,
    even while it waits out its rollback grace period)."""
    policy = entry.config.version_policy
    served = set(apply_policy(sort_versions(entry.versions), policy))
    routed = {v for route in entry.aliases.values() for v in route.versions}
    return tuple(sort_versions(served | (routed & entry.versions.keys())))


def model_statistics(
    service: ModelService, name: str | None, version: str | None
) -> dict[str, object]:
    """Triton's statistics extension: ``{"model_stats": [...]}`` for every known version
    of every model (no ``name``), of one model, or of one version."""
    records: list[ServedVersion]
    if name is None:
        records = list(service.versions())
    elif version:
        records = [service.resolve(check_model_name(name), check_version_name(version))]
    else:
        records = list(service.model(check_model_name(name)).versions.values())
    records.sort(key=lambda r: (r.key.name, order_key(r.key.version)))
    return {"model_stats": [r.infer_stats.as_dict(r.key.name, r.key.version) for r in records]}


def repository_rows(service: ModelService, ready_only: bool) -> list[dict[str, Any]]:
    """``[{"name", "version", "state", "reason"}]`` for every known version."""
    rows: list[dict[str, Any]] = []
    for record in service.versions():
        if ready_only and not record.is_ready:
            continue
        state = record.state
        if state is ModelState.READY and not record.is_ready:
            state = ModelState.LOADING
        rows.append(
            {
                "name": record.key.name,
                "version": record.key.version,
                "state": state.value,
                "reason": hide_paths(record.reason),
            }
        )
    if not ready_only:
        # A configured model with no version to serve is listed, not hidden.
        rows += [
            {
                "name": entry.config.name,
                "version": "",
                "state": ModelState.FAILED.value,
                "reason": service.missing_reason(entry),
            }
            for entry in service.models().values()
            if not entry.versions
        ]
    return rows
