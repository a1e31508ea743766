"""The protocol's datatype table and conversions to and from numpy."""

from __future__ import annotations

import numpy as np

from modelyard.errors import InvalidInputError

# BYTES tensors are numpy object arrays of ``bytes``; everything else is fixed width.
_V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
}
_NUMPY_TO_V2: dict[np.dtype, str] = {v: k for k, v in _V2_TO_NUMPY.items()}

DATATYPES: frozenset[str] = frozenset(_V2_TO_NUMPY)
"""Every datatype name the protocol defines."""


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a protocol datatype; InvalidInputError for unknown names."""
    try:
        return _V2_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidInputError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(sorted(DATATYPES))}"
        ) from None


def v2_datatype(dtype: np.dtype) -> str:
    """The protocol datatype of a numpy dtype (strings and bytes map to BYTES)."""
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    try:
        return _NUMPY_TO_V2[dtype]
    except KeyError:
        raise InvalidInputError(f"numpy dtype {dtype} has no protocol datatype") from None


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-width datatype (0 for BYTES)."""
    dt = numpy_dtype(datatype)
    return 0 if datatype == "BYTES" else dt.itemsize
