"""Warm-up inputs: generated from a model's metadata, or taken from its config."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from modelyard.protocol.datatypes import numpy_dtype
from modelyard.runtimes.base import TensorSpec


def make_warmup_inputs(
    specs: Sequence[TensorSpec], samples: Mapping[str, object] | None = None
) -> dict[str, np.ndarray]:
    """One small batch per input: the config's sample where given, else generated.

    Dynamic dimensions become 1 (a batch of one, a sequence of one). Integer inputs
    get zeros, which are valid indices for embedding-style inputs such as token ids.
    """
    out: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    for spec in specs:
        dtype = numpy_dtype(spec.datatype)
        if samples and spec.name in samples:
            out[spec.name] = np.asarray(samples[spec.name], dtype=dtype)
            continue
        shape = tuple(d if d > 0 else 1 for d in spec.shape)
        if spec.datatype == "BYTES":
            arr = np.empty(shape, dtype=object)
            arr.fill(b"warm-up")
        elif dtype.kind == "f":
            arr = rng.random(shape).astype(dtype)
        elif dtype.kind == "b":
            arr = np.zeros(shape, dtype=dtype)
        else:
            arr = np.zeros(shape, dtype=dtype)
            if spec.name == "attention_mask":
                arr[...] = 1
        out[spec.name] = arr
    return out
