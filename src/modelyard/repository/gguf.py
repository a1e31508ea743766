"""Read a GGUF file's metadata (its key/value header) without loading the model.

The server sizes a generative model's reservation before any worker starts (weights,
KV cache, compute buffers) and answers ``context_length`` for models not loaded yet, so
it reads the header itself: a few kilobytes, pure Python, no ``llama_cpp`` or ``gguf``
import in the server process. Arrays (the vocabulary, the merges) are skipped; only
their lengths are kept.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

_MAGIC = b"GGUF"
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9
_MAX_STRING_BYTES = 64 * 1024 * 1024
_MAX_KEYS = 1 << 20
_MAX_DIMS = 8


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """An array value's element type and length (its items are not read)."""

    item_type: int
    length: int


GGUFValue = int | float | bool | str | ArrayInfo


def _read(f: BinaryIO, fmt: str) -> object:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _read_int(f: BinaryIO, fmt: str) -> int:
    value = _read(f, fmt)
    assert isinstance(value, int)
    return value


def _read_string(f: BinaryIO) -> str:
    n = _read_int(f, "<Q")
    if n > _MAX_STRING_BYTES:
        raise GGUFError(f"GGUF string of {n} bytes")
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("truncated GGUF header")
    return data.decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, kind: int) -> GGUFValue:
    if kind in _SCALARS:
        value = _read(f, _SCALARS[kind])
        assert isinstance(value, int | float | bool)
        return value
    if kind == _STRING:
        return _read_string(f)
    if kind == _ARRAY:
        item = _read_int(f, "<I")
        n = _read_int(f, "<Q")
        if item in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[item]) * n, 1)
        elif item == _STRING:
            for _ in range(n):
                f.seek(_read_int(f, "<Q"), 1)
        else:
            raise GGUFError(f"GGUF array of type {item} is not supported")
        return ArrayInfo(item, n)
    raise GGUFError(f"unknown GGUF value type {kind}")


def _read_header(f: BinaryIO, path: Path) -> tuple[dict[str, GGUFValue], int]:
    """The metadata and the tensor count; ``f`` is left at the first tensor's info."""
    if f.read(4) != _MAGIC:
        raise GGUFError(f"{path.name} is not a GGUF file")
    version = _read_int(f, "<I")
    if version < 2:
        raise GGUFError(f"{path.name}: GGUF version {version} is too old")
    tensors = _read_int(f, "<Q")
    keys = _read_int(f, "<Q")
    if keys > _MAX_KEYS:
        raise GGUFError(f"{path.name}: {keys} metadata keys")
    meta: dict[str, GGUFValue] = {}
    for _ in range(keys):
        key = _read_string(f)
        meta[key] = _read_value(f, _read_int(f, "<I"))
    return meta, tensors


def read_metadata(path: Path) -> dict[str, GGUFValue]:
    """The key/value metadata of the GGUF file at ``path`` (GGUFError if it is not one)."""
    with path.open("rb") as f:
        return _read_header(f, path)[0]


def tensor_sizes(path: Path) -> dict[str, int]:
    """Bytes of each tensor of the GGUF file at ``path``, by name.

    Read from the offsets in the header: a tensor runs to the next one's offset (its
    alignment padding included), the last to the end of the file, so no table of the
    quantisation formats' block sizes is needed and every format is sized alike.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        meta, count = _read_header(f, path)
        if count > _MAX_KEYS:
            raise GGUFError(f"{path.name}: {count} tensors")
        offsets: list[tuple[int, str]] = []
        for _ in range(count):
            name = _read_string(f)
            dims = _read_int(f, "<I")
            if dims > _MAX_DIMS:
                raise GGUFError(f"{path.name}: tensor {name} has {dims} dimensions")
            f.seek(8 * dims + 4, 1)  # the dimensions and the element type
            offsets.append((_read_int(f, "<Q"), name))
        align = meta.get("general.alignment", 32)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0:
            raise GGUFError(f"{path.name}: general.alignment is {align!r}")
        data_start = -(-f.tell() // align) * align
    offsets.sort()
    ends = [o for o, _ in offsets[1:]] + [size - data_start]
    sizes = {name: end - offset for (offset, name), end in zip(offsets, ends, strict=True)}
    if any(n < 0 for n in sizes.values()):
        raise GGUFError(f"{path.name}: tensor data runs past the end of the file")
    return sizes


@dataclass(frozen=True, slots=True)
class LlamaDims:
    """What the memory estimate needs from a GGUF header."""

    architecture: str
    context_length: int
    layers: int
    width: int
    heads: int
    kv_heads: int
    head_dim_k: int
    head_dim_v: int
    vocab_size: int
    feed_forward: int = 0

    def kv_bytes_per_token(self, element_bytes: int = 2) -> int:
        """KV-cache bytes one token of one sequence takes: layers x KV heads x head size
        x element size, for K and for V."""
        return self.layers * self.kv_heads * (self.head_dim_k + self.head_dim_v) * element_bytes


def llama_dims(meta: dict[str, GGUFValue]) -> LlamaDims:
    """The dimensions of a transformer from its GGUF metadata (GGUFError if missing)."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise GGUFError("GGUF metadata has no general.architecture")

    def num(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, ArrayInfo):  # per-layer head counts: take the bound
            raise GGUFError(f"GGUF key {arch}.{key} varies per layer; not supported")
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise GGUFError(f"GGUF metadata has no {arch}.{key}")
        return int(value)

    width = num("embedding_length")
    heads = num("attention.head_count")
    head_dim = width // max(1, heads)
    tokens = meta.get("tokenizer.ggml.tokens")
    return LlamaDims(
        architecture=arch,
        context_length=num("context_length"),
        layers=num("block_count"),
        width=width,
        heads=heads,
        kv_heads=num("attention.head_count_kv", heads),
        head_dim_k=num("attention.key_length", head_dim),
        head_dim_v=num("attention.value_length", head_dim),
        vocab_size=tokens.length if isinstance(tokens, ArrayInfo) else 0,
        feed_forward=num("feed_forward_length", 4 * width),
    )
