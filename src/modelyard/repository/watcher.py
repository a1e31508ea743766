"""Repository polling: notices new and removed version folders, never half-written ones.

A new version is *taken* once its manifest exists (writers put it last), or, without a
manifest, once its files (names, sizes, mtimes) have not changed for ``settle_s``. A
version that was taken and then refused (corrupt, bad manifest, taken early from a slow
writer) is offered again, by the same rules, as soon as its files change.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.repository.layout import list_versions
from modelyard.repository.manifest import MANIFEST_NAME
from modelyard.repository.version_labels import sort_versions

Signature = tuple[tuple[str, int, int], ...]


def folder_signature(path: Path) -> Signature:
    """Names, sizes and mtimes of every file under ``path``."""
    items = []
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            items.append((p.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(items)


@dataclass
class ScanResult:
    """What changed in one model folder since the last scan."""

    ready: list[str] = field(default_factory=list)
    """New (or refused and since changed) version folders that are complete."""
    removed: list[str] = field(default_factory=list)
    """Known versions whose folders are gone."""


class RepositoryWatcher:
    """Remembers what it saw per folder between scans."""

    def __init__(self, settle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.settle_s = settle_s
        self._clock = clock
        self._seen: dict[Path, tuple[Signature, float]] = {}
        self._taken: dict[Path, Signature] = {}

    def scan(self, model_dir: Path, known: set[str], refused: set[str] | None = None) -> ScanResult:
        """Compare the folder with ``known`` versions; report complete new ones and removals.

        ``refused`` versions (among ``known``, refused when offered) are offered again
        once their files differ from what was offered last time.
        """
        result = ScanResult()
        on_disk = {str(v) for v in list_versions(model_dir)}
        result.removed = sorted(v for v in known if v not in on_disk)
        for version in result.removed:
            # A folder restored later (even byte for byte) is a new version again.
            self._seen.pop(model_dir / version, None)
            self._taken.pop(model_dir / version, None)
        now = self._clock()
        retry = (refused or set()) & on_disk
        for version in sort_versions((on_disk - known) | retry):
            vdir = model_dir / version
            sig = folder_signature(vdir)
            if self._taken.get(vdir) == sig:
                continue  # already offered in this exact state (and maybe refused)
            first_seen = self._seen.get(vdir)
            if first_seen is None or first_seen[0] != sig:
                self._seen[vdir] = (sig, now)
                first_seen = self._seen[vdir]
            complete = (vdir / MANIFEST_NAME).is_file()
            settled = bool(sig) and now - first_seen[1] >= self.settle_s
            if complete or settled:
                self._taken[vdir] = sig
                result.ready.append(version)
        return result

    def note_taken(self, version_dir: Path) -> None:
        """Remember ``version_dir`` as offered in its present state (known at start-up)."""
        self._taken[version_dir] = folder_signature(version_dir)
