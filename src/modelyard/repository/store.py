"""A shared model store: versions read from a URI every node can read, cached per node.

In Ray mode (``ray.model_store``) an actor does not read the server's repository path:
it fetches its version from the store (``file:///srv/models``, or any URI an `fsspec
<https://filesystem-spec.readthedocs.io>`_ backend reads, such as ``s3://bucket/models``
with ``s3fs``) into the node's cache, once per node, and loads from there.

The version's manifest (``modelyard-manifest.json``, repository/manifest.py) says which
files to fetch and their SHA256: a version without one is refused, a file outside the
version folder is refused, and a copy whose files do not match is never published to the
cache. A cache entry is named by its manifest's digest, so a version re-published with
other files is fetched again, and no actor sees a half-written copy: a fetch writes to a
temporary folder, verifies it, then renames it into place, under a per-version lock
that the node's actors share. A cached copy is hashed again before each load.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from modelyard.errors import ModelLoadError
from modelyard.repository.manifest import MANIFEST_NAME, ManifestError, verify_manifest

__all__ = ["ModelStore", "StoreError", "StoredVersion", "store_relative_path"]

_MAX_MANIFEST_BYTES = 4 << 20
"""A manifest larger than this is refused (it lists files, it does not hold them)."""


class StoreError(ModelLoadError):
    """The store could not give a version: unreachable, no manifest, a bad file name."""


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """A version in a node's cache."""

    path: Path
    """The cached version folder the runtime loads from."""
    fetched: bool
    """True when this call fetched (and verified) it; False: it was already cached."""


def store_relative_path(version_dir: Path, repository_root: Path) -> str:
    """``MODEL/VERSION`` of ``version_dir`` inside the server's repository, as the store
    names it; StoreError when the version lies outside the repository."""
    try:
        relative = version_dir.resolve().relative_to(repository_root.resolve())
    except ValueError:
        raise StoreError(
            f"{version_dir} is outside the model repository {repository_root}: a model "
            "store holds only the repository's versions"
        ) from None
    return relative.as_posix()


def _safe_relative(name: str, what: str) -> PurePosixPath:
    """``name`` as a relative path that stays inside its folder."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts or "\\" in name or "\x00" in name:
        raise StoreError(f"the model store refuses {what} {name!r}: not a plain relative path")
    return path


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock between the actors of this node fetching one version."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class ModelStore:
    """The store at ``uri`` as one node sees it, with its cache at ``cache_dir``."""

    def __init__(self, uri: str, cache_dir: Path) -> None:
        import fsspec  # the 'ray' extra; imported where a store is used

        self.uri = uri
        self.cache_dir = cache_dir
        try:
            self._fs, root = fsspec.core.url_to_fs(uri)
        except (ImportError, ValueError) as exc:
            raise StoreError(f"cannot open the model store {uri!r}: {exc}") from None
        self._root = str(root).rstrip("/")

    def _url(self, relative: PurePosixPath) -> str:
        return f"{self._root}/{relative.as_posix()}"

    def _read_manifest(self, version: PurePosixPath) -> bytes:
        url = self._url(version / MANIFEST_NAME)
        try:
            size = int(self._fs.size(url))
            if size > _MAX_MANIFEST_BYTES:
                raise StoreError(f"{self.uri}/{version}: manifest of {size} bytes is too large")
            data: bytes = self._fs.cat_file(url)
        except FileNotFoundError:
            raise StoreError(
                f"{self.uri}/{version}: no {MANIFEST_NAME} in the model store (a stored "
                "version needs one: `modelyard manifest` writes it)"
            ) from None
        except OSError as exc:
            raise StoreError(f"cannot read {self.uri}/{version}: {exc}") from None
        return data

    def fetch(self, relative: str, public_keys: list[Any] | None = None) -> StoredVersion:
        """The version ``MODEL/VERSION`` in this node's cache, verified against its
        manifest: fetched unless already there, and a cached copy checked again (the
        cache is a plain folder on the node: one that no longer matches is fetched anew).
        ManifestError when the store's own files do not match."""
        version = _safe_relative(relative, "the version")
        manifest = self._read_manifest(version)
        digest = hashlib.sha256(manifest).hexdigest()[:16]
        target = self.cache_dir / version.parent / f"{version.name}.{digest}"
        with _locked(target.with_name(f".{target.name}.lock")):
            if target.is_dir():
                try:
                    verify_manifest(target, public_keys=public_keys, require=True)
                    return StoredVersion(target, fetched=False)
                except ManifestError:
                    shutil.rmtree(target, ignore_errors=True)
            staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            try:
                self._download(version, manifest, staging)
                verify_manifest(staging, public_keys=public_keys, require=True)
                staging.rename(target)
            except ManifestError as exc:
                raise ManifestError(f"model store {self.uri}/{version}: {exc}") from None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return StoredVersion(target, fetched=True)

    def _download(self, version: PurePosixPath, manifest: bytes, staging: Path) -> None:
        """Every file the manifest lists, into ``staging``, and the manifest itself."""
        try:
            files = json.loads(manifest)["files"]
            names = [_safe_relative(str(n), "the file") for n in files]
        except (ValueError, KeyError, TypeError) as exc:
            raise ManifestError(f"{self.uri}/{version}: unreadable manifest: {exc}") from None
        staging.mkdir(parents=True)
        for name in names:
            local = staging / name
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._fs.get_file(self._url(version / name), str(local))
            except FileNotFoundError:
                raise ManifestError(
                    f"{self.uri}/{version}: file {name} listed in the manifest is missing"
                ) from None
            except OSError as exc:
                raise StoreError(f"cannot fetch {self.uri}/{version}/{name}: {exc}") from None
        (staging / MANIFEST_NAME).write_bytes(manifest)
