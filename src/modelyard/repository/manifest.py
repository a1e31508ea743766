"""SHA256 manifests of model versions: write, sign (Ed25519), verify.

A manifest is ``modelyard-manifest.json`` in the version folder::

    {"format": 1, "files": {"model.onnx": {"sha256": "…", "size": 123}},
     "signature": "<base64 Ed25519 signature of the canonical files JSON>"}   # optional
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from modelyard.errors import ModelLoadError

MANIFEST_NAME = "modelyard-manifest.json"
_CHUNK = 1 << 20


class ManifestError(ModelLoadError):
    """The version's files do not match its manifest (or its signature)."""


def sha256_file(path: Path) -> str:
    """Hex SHA256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _version_files(version_dir: Path) -> list[Path]:
    return sorted(
        p
        for p in version_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME and "__pycache__" not in p.parts
    )


def _canonical(files: dict[str, Any]) -> bytes:
    return json.dumps(files, sort_keys=True, separators=(",", ":")).encode()


def load_private_key(path: Path) -> Any:
    """An Ed25519 private key from a PEM file."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return load_pem_private_key(path.read_bytes(), password=None)


def load_public_key(text_or_path: str) -> Any:
    """An Ed25519 public key: a PEM file path, PEM text, or base64 of the raw 32 bytes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = text_or_path.strip()
    if "BEGIN PUBLIC KEY" in text:
        return load_pem_public_key(text.encode())
    path = Path(text)
    if path.is_file():
        return load_pem_public_key(path.read_bytes())
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(text))


def write_manifest(version_dir: Path, private_key_file: Path | None = None) -> Path:
    """Hash every file of the version (and sign when a key is given); returns the manifest."""
    files = {
        p.relative_to(version_dir).as_posix(): {"sha256": sha256_file(p), "size": p.stat().st_size}
        for p in _version_files(version_dir)
    }
    doc: dict[str, Any] = {"format": 1, "files": files}
    if private_key_file is not None:
        key = load_private_key(private_key_file)
        doc["signature"] = base64.b64encode(key.sign(_canonical(files))).decode()
    out = version_dir / MANIFEST_NAME
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
    tmp.replace(out)
    return out


def has_manifest(version_dir: Path) -> bool:
    """True when the version folder holds a manifest."""
    return (version_dir / MANIFEST_NAME).is_file()


def verify_manifest(
    version_dir: Path, *, public_keys: list[Any] | None = None, require: bool = False
) -> bool:
    """Check every file against the manifest; True if verified, False if none (allowed).

    Raises :class:`ManifestError` naming the file with expected and actual digests, a
    missing or unlisted file, a bad signature, or a missing manifest when ``require``.
    """
    path = version_dir / MANIFEST_NAME
    if not path.is_file():
        if require:
            raise ManifestError(f"{version_dir}: no {MANIFEST_NAME} and manifests are required")
        return False
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        files: dict[str, dict[str, Any]] = doc["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: unreadable manifest: {exc}") from None
    if public_keys:
        signature = doc.get("signature")
        if not signature:
            raise ManifestError(f"{path}: manifest is not signed but signing keys are configured")
        from cryptography.exceptions import InvalidSignature

        raw = base64.b64decode(signature)
        for key in public_keys:
            try:
                key.verify(raw, _canonical(files))
                break
            except InvalidSignature:
                continue
        else:
            raise ManifestError(f"{path}: signature does not match any configured public key")
    present = {p.relative_to(version_dir).as_posix(): p for p in _version_files(version_dir)}
    for name, entry in sorted(files.items()):
        file = present.get(name)
        if file is None:
            raise ManifestError(f"{version_dir}: file {name} listed in the manifest is missing")
        actual = sha256_file(file)
        if actual != entry.get("sha256"):
            raise ManifestError(
                f"{version_dir}: {name} has SHA256 {actual}, manifest expects {entry.get('sha256')}"
            )
    extra = sorted(set(present) - set(files))
    if extra:
        raise ManifestError(f"{version_dir}: files not in the manifest: {', '.join(extra)}")
    return True
