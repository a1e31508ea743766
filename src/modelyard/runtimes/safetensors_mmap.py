"""Memory-mapped safetensors files: tensors that point into the file's pages.

A private (copy-on-write) mapping: the weights are read from the page cache on first
touch and shared by every worker that maps the same file, and nothing is copied unless
a tensor is written (inference never writes weights). Kept free of the ``safetensors``
package: the format is an 8-byte header length, a JSON header, then raw bytes.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

# safetensors dtype names to torch dtype attribute names.
_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}

_MAX_HEADER_BYTES = 100 * 1024 * 1024
"""A header larger than this is a corrupt file, not a model."""


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names to dtype, shape, offsets)."""
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path.name} is too short to be a safetensors file")
        (size,) = struct.unpack("<Q", prefix)
        if size > _MAX_HEADER_BYTES:
            raise ValueError(f"{path.name} is not a safetensors file (header of {size} bytes)")
        header: dict[str, Any] = json.loads(f.read(size))
    header["__data_offset__"] = 8 + size
    return header


def mmap_state_dict(path: Path) -> dict[str, Any]:
    """Every tensor of the file as a torch tensor backed by one private mapping."""
    import torch

    header = read_header(path)
    start = int(header.pop("__data_offset__"))
    header.pop("__metadata__", None)
    with path.open("rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    tensors: dict[str, Any] = {}
    for name, info in header.items():
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path.name}: tensor {name!r} has dtype {info['dtype']!r}")
        dtype = getattr(torch, _DTYPES[info["dtype"]])
        begin, end = (int(v) for v in info["data_offsets"])
        shape = [int(d) for d in info["shape"]]
        count = end - begin
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=torch.uint8, count=count, offset=start + begin)
        if (start + begin) % dtype.itemsize:
            # A misaligned tensor cannot be viewed in place; this one alone is copied.
            flat = flat.clone()
        tensors[name] = flat.view(dtype).reshape(shape)
    return tensors
