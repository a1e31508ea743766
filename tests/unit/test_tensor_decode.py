"""decode_input looks a JSON input's datatype up once and gets what it got before."""

from __future__ import annotations

import numpy as np
import pytest

from modelyard.errors import InvalidInputError
from modelyard.protocol import datatypes, json_tensors, tensors
from modelyard.protocol.tensors import array_from_json, decode_input

SPEC = {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1.5, 2], [3, 4]]}


def test_json_input_looks_its_datatype_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(datatype: str) -> np.dtype:
        calls.append(datatype)
        return datatypes.numpy_dtype(datatype)

    monkeypatch.setattr(tensors, "numpy_dtype", counted)
    monkeypatch.setattr(json_tensors, "numpy_dtype", counted)
    tensor, offset = decode_input(SPEC, None, 0)
    assert calls == ["FP32"]
    assert offset == 0
    assert tensor.array.dtype == np.float32
    np.testing.assert_array_equal(tensor.array, [[1.5, 2], [3, 4]])


def test_array_from_json_with_and_without_the_dtype_agree() -> None:
    data = [[1, 2], [3, 4]]
    given = array_from_json("x", "INT16", (2, 2), data, np.dtype(np.int16))
    looked_up = array_from_json("x", "INT16", (2, 2), data)
    assert given.dtype == looked_up.dtype == np.int16
    np.testing.assert_array_equal(given, looked_up)


def test_an_unknown_datatype_is_still_refused_first() -> None:
    with pytest.raises(InvalidInputError, match="unknown datatype 'FP33'"):
        decode_input({**SPEC, "datatype": "FP33", "shape": "bad"}, None, 0)
    with pytest.raises(InvalidInputError, match="unknown datatype 'FP33'"):
        array_from_json("x", "FP33", (1,), [1.0])
