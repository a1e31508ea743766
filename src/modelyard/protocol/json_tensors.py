"""JSON tensor data ⇄ numpy arrays, strictly: every element has the datatype's JSON type.

The rules, the same for every datatype and every front end that reads JSON lists
(v2 ``data``, ``/predict`` inputs):

- FP16/FP32/FP64: JSON numbers, plus the strings ``"NaN"``, ``"Infinity"`` and
  ``"-Infinity"`` (JSON has no such numbers; the spelling is protobuf's JSON mapping,
  and it is what the server writes for them in outputs). ``null``, booleans and any
  other string are refused; a finite number too large for the datatype is refused,
  never turned into infinity.
- INT*/UINT*: JSON integers in the datatype's range; a number with a fraction is
  refused (``2.0`` is accepted as 2, below 2**53 in magnitude, where doubles stop
  holding every integer); nothing wraps around.
- BOOL: ``true`` and ``false`` only. BYTES: strings only (UTF-8 on the wire).
- Nested lists are accepted (row-major) when they are rectangular.

Speed: one C-level pass collects the set of element types (``set(map(type, flat))``),
then numpy builds the array in one call; numpy (2 or newer) refuses a Python integer
out of the dtype's range itself. Float range checks are vectorised numpy passes past
:data:`SMALL` elements, C-level ``min``/``max`` below it (numpy's fixed costs dominate
small tensors). Per-element Python code runs only on the rare paths (non-finite
strings, integral floats in integer data) and to build error messages.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from modelyard.errors import InvalidInputError
from modelyard.protocol.datatypes import numpy_dtype

NONFINITE_STRINGS: dict[str, float] = {
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}
"""How non-finite floats are spelled in JSON tensor data, both ways."""

SMALL = 64
"""Up to this many elements, checks run as C-level Python passes; past it, in numpy."""


def _overflow_edge(dtype: np.dtype) -> float:
    # The smallest magnitude that rounds to infinity: the largest finite value plus
    # half a unit in its last place (exact in a double for FP16 and FP32).
    if dtype == np.float64:
        return math.inf
    info = np.finfo(dtype)
    return float(info.max) + 2.0 ** (info.maxexp - info.nmant - 2)


_OVERFLOW_EDGE = {name: _overflow_edge(numpy_dtype(name)) for name in ("FP16", "FP32", "FP64")}
_EXACT_FLOAT_INT = 2.0**53
"""Largest magnitude up to which a double holds every integer exactly."""
_NUMBER = frozenset({int, float})
_INT = frozenset({int})
_FLOAT_KINDS = "f"
_INT_KINDS = "iu"


def _type_name(t: type) -> str:
    return {
        type(None): "null",
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "a list",
        dict: "an object",
    }.get(t, t.__name__)


def _refuse(name: str, datatype: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"input {name!r}: data does not fit datatype {datatype}: {why}")


def _not_rectangular(name: str) -> InvalidInputError:
    return InvalidInputError(
        f"input {name!r}: nested 'data' lists must be rectangular (every list at one depth "
        "the same length, values only at the deepest)"
    )


def flatten(name: str, data: list[Any]) -> tuple[list[Any], tuple[int, ...]]:
    """Row-major leaves of ``data`` and the shape of its nesting; rectangular or refused."""
    shape = [len(data)]
    level = data
    while level and type(level[0]) is list:
        kinds = set(map(type, level))
        lengths = set(map(len, level)) if kinds == {list} else set()
        if len(lengths) != 1:
            raise _not_rectangular(name)
        shape.append(lengths.pop())
        level = list(itertools.chain.from_iterable(level))
    return level, tuple(shape)


def _float_array(
    name: str, datatype: str, dtype: np.dtype, flat: list[Any], kinds: set[type]
) -> np.ndarray:
    strings = 0
    if not kinds <= _NUMBER:
        if kinds - _NUMBER - {str}:
            bad = next(iter(kinds - _NUMBER - {str}))
            raise _refuse(name, datatype, f"elements must be numbers, got {_type_name(bad)}")
        texts = [v for v in flat if type(v) is str]
        unknown = set(texts) - NONFINITE_STRINGS.keys()
        if unknown:
            raise _refuse(
                name,
                datatype,
                f'elements must be numbers (or "NaN", "Infinity", "-Infinity"), got '
                f"the string {next(iter(unknown))!r}",
            )
        strings = len(texts)
        flat = [NONFINITE_STRINGS[v] if type(v) is str else v for v in flat]
    if not strings and len(flat) <= SMALL:
        # Small tensors (most requests): two C-level passes beat numpy's fixed costs
        # (errstate and isfinite cost ~2 us each). JSON numbers are finite doubles, so
        # only a magnitude past the datatype's rounding edge can overflow.
        edge = _OVERFLOW_EDGE[datatype]
        if max(flat) >= edge or min(flat) <= -edge:
            raise _refuse(name, datatype, f"a number is out of range for {datatype}")
        try:
            return np.asarray(flat, dtype=dtype)
        except OverflowError:  # an integer past any float (FP64's edge is infinite)
            raise _refuse(name, datatype, f"a number is out of range for {datatype}") from None
    # Overflow to infinity is detected below; numpy's warning about it is not wanted.
    try:
        with np.errstate(over="ignore"):
            arr = np.asarray(flat, dtype=dtype)
    except OverflowError:
        raise _refuse(name, datatype, f"a number is out of range for {datatype}") from None
    # Only the spelled-out strings may give non-finite values; anything else overflowed.
    finite = np.count_nonzero(~np.isfinite(arr)) == strings if strings else np.isfinite(arr).all()
    if not finite:
        raise _refuse(name, datatype, f"a number is out of range for {datatype}")
    return arr


def _int_array(
    name: str, datatype: str, dtype: np.dtype, flat: list[Any], kinds: set[type]
) -> np.ndarray:
    if not kinds <= _INT:
        if not kinds <= _NUMBER:
            bad = next(iter(kinds - _NUMBER))
            raise _refuse(name, datatype, f"elements must be integers, got {_type_name(bad)}")
        # Rare: integral floats such as 2.0. Check the floats alone, exactly, then let
        # numpy convert (in range, integral: the cast is exact).
        floats = np.array([v for v in flat if type(v) is float], dtype=np.float64)
        if not (np.trunc(floats) == floats).all():
            raise _refuse(name, datatype, "elements must be integers, got a fraction")
        info = np.iinfo(dtype)
        # float(info.max) + 1 is exactly 2**bits (or 2**(bits-1)), the first value out.
        if floats.min() < float(info.min) or floats.max() >= float(info.max) + 1.0:
            raise _refuse(name, datatype, f"values must lie in [{info.min}, {info.max}]")
        # From 2**53 on a double no longer holds every integer (the literal
        # 9007199254740993.0 parses as 2**53 itself, so 2**53 is refused too), and orjson
        # reads an integer literal beyond 64 bits (e.g. -2**63 - 1) as the nearest double:
        # accepting it would silently change the value.
        if np.abs(floats).max() >= _EXACT_FLOAT_INT:
            raise _refuse(
                name,
                datatype,
                f"an integer beyond 2**53 must be written as a plain integer within [{info.min}, "
                f"{info.max}]",
            )
    try:
        return np.asarray(flat, dtype=dtype)
    except OverflowError:
        info = np.iinfo(dtype)
        raise _refuse(name, datatype, f"values must lie in [{info.min}, {info.max}]") from None


def typed_array(
    name: str, datatype: str, flat: list[Any], dtype: np.dtype | None = None
) -> np.ndarray:
    """A 1-D array of ``datatype`` from flat JSON values; InvalidInputError on any mismatch.

    ``dtype``: ``numpy_dtype(datatype)`` if the caller has it already (None: looked up here)."""
    if dtype is None:
        dtype = numpy_dtype(datatype)
    kinds = set(map(type, flat))
    if not kinds:
        return np.empty(0, dtype=dtype)
    if list in kinds:
        raise _not_rectangular(name)
    if dtype.kind in _FLOAT_KINDS:
        return _float_array(name, datatype, dtype, flat, kinds)
    if dtype.kind in _INT_KINDS:
        return _int_array(name, datatype, dtype, flat, kinds)
    if datatype == "BOOL":
        if kinds != {bool}:
            bad = next(iter(kinds - {bool}))
            raise _refuse(name, datatype, f"elements must be true or false, got {_type_name(bad)}")
        return np.asarray(flat, dtype=dtype)
    # BYTES
    if kinds != {str}:
        bad = next(iter(kinds - {str}))
        raise _refuse(name, datatype, f"elements must be strings, got {_type_name(bad)}")
    arr = np.empty(len(flat), dtype=object)
    try:
        arr[:] = [s.encode("utf-8") for s in flat]
    except UnicodeEncodeError:
        raise _refuse(name, datatype, "a string is not valid Unicode") from None
    return arr


def array_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: object, dtype: np.dtype | None = None
) -> np.ndarray:
    """The array of one JSON input tensor: ``data`` (flat or nested) must fill ``shape``.

    ``dtype``: ``numpy_dtype(datatype)`` if the caller has it already, which also says the
    datatype is known (None: looked up, and so checked, here)."""
    if not isinstance(data, list):
        raise InvalidInputError(f"input {name!r}: 'data' must be a list, got {type(data).__name__}")
    if dtype is None:
        dtype = numpy_dtype(datatype)
    flat, _ = flatten(name, data)
    expected = math.prod(shape)
    if len(flat) != expected:
        raise InvalidInputError(
            f"input {name!r}: shape {list(shape)} needs {expected} elements, got {len(flat)}"
        )
    return typed_array(name, datatype, flat, dtype).reshape(shape)


def array_from_nested(name: str, datatype: str, data: object) -> np.ndarray:
    """The array of a nested JSON list (its shape is its nesting) or of one scalar value."""
    if not isinstance(data, list):
        return typed_array(name, datatype, [data]).reshape(())
    flat, shape = flatten(name, data)
    return typed_array(name, datatype, flat).reshape(shape)


def _spelled(arr: np.ndarray) -> np.ndarray:
    out = arr.astype(np.float64).astype(object)
    out[np.isnan(arr)] = "NaN"
    out[np.isposinf(arr)] = "Infinity"
    out[np.isneginf(arr)] = "-Infinity"
    return out


def _all_finite(arr: np.ndarray) -> bool:
    return arr.dtype.kind != "f" or not arr.size or bool(np.isfinite(arr).all())


def _finite_values(values: list[Any]) -> bool:
    # math.isfinite over a small list costs less than numpy's isfinite call.
    return all(map(math.isfinite, values))


def json_nested(arr: np.ndarray) -> np.ndarray | list[Any]:
    """``arr`` itself (orjson writes it with ``OPT_SERIALIZE_NUMPY``), or nested lists.

    JSON has no NaN or infinity and orjson writes them as ``null``, which would be a
    silent change of value; with any of them the array becomes nested lists that spell
    them as :data:`NONFINITE_STRINGS` does.
    """
    if _all_finite(arr):
        return arr
    nested: list[Any] = _spelled(arr).tolist()
    return nested


def json_list(arr: np.ndarray) -> list[Any]:
    """Flat row-major JSON values of a numeric or BOOL array (non-finite as strings)."""
    if arr.dtype == np.float16:
        arr = arr.astype(np.float32)
    flat = arr.reshape(-1)
    if flat.dtype.kind != "f":
        values: list[Any] = flat.tolist()
        return values
    if flat.size <= SMALL:
        values = flat.tolist()
        return values if _finite_values(values) else _spelled(flat).tolist()
    spelled: list[Any] = (flat if _all_finite(flat) else _spelled(flat)).tolist()
    return spelled
