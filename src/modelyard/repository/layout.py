"""Triton-style repository layout: ``<model>/<version>/…``; a version folder's name is a
version label (``1``, ``1.3``, ``2024-11-01``; see
:mod:`modelyard.repository.version_labels` for which names count and how they order)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from modelyard.repository.version_labels import is_version_label, sort_versions

if TYPE_CHECKING:  # at run time only its attributes are read: no config import cycle
    from modelyard.config.model_config import VersionPolicy


def list_versions(model_dir: Path) -> list[str]:
    """Version folders of a model, oldest first; hidden and other folders ignored."""
    if not model_dir.is_dir():
        return []
    return sort_versions(
        p.name for p in model_dir.iterdir() if p.is_dir() and is_version_label(p.name)
    )


def repository_models(root: Path) -> list[str]:
    """Names of the folders in ``root`` that are model folders (hold version folders),
    sorted; empty when ``root`` is a model or version folder rather than a repository."""
    names = []
    for child in root.iterdir():
        if child.is_dir() and not child.name.startswith(".") and list_versions(child):
            names.append(child.name)
    names.sort()
    return names


def served_versions(model_dir: Path, policy: VersionPolicy) -> list[str]:
    """The versions the policy serves, oldest first."""
    return apply_policy(list_versions(model_dir), policy)


def apply_policy(versions: list[str], policy: VersionPolicy) -> list[str]:
    """The versions among ``versions`` (oldest first) that the policy serves, oldest first."""
    if policy.all:
        return versions
    if policy.specific is not None:
        wanted = {str(v) for v in policy.specific}
        return [v for v in versions if v in wanted]
    n = policy.latest or 1
    return versions[-n:]


def missing_versions_reason(model_dir: Path, policy: VersionPolicy) -> str:
    """Why ``model_dir`` offers no version to serve: missing, empty, or none the policy takes."""
    if not model_dir.exists():
        return f"{model_dir} does not exist"
    found = list_versions(model_dir)
    if not found:
        return f"{model_dir} has no version folders (<model>/<version>/<files>)"
    wanted = policy.model_dump(exclude_defaults=True) or {"latest": policy.latest}
    listed = ", ".join(str(v) for v in found)
    return f"no version folder in {model_dir} matches version_policy {wanted} (found: {listed})"


def version_dir(model_dir: Path, version: str | int) -> Path:
    """The folder of one version."""
    return model_dir / str(version)


def dir_size_bytes(path: Path) -> int:
    """Total size of the files under ``path`` (the size-based footprint guess)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
