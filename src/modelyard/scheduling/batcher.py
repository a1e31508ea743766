"""Dynamic batching: which queued requests go together, and how their tensors combine.

Requests batch together when every input has the same name, dtype and trailing shape
(everything but axis 0); each may carry several rows. Inputs are concatenated along
axis 0 and each output is split back by the row counts, so a model whose rows are
independent returns exactly what it would have returned for each request alone.

A batch holds at most ``max_rows`` rows (and, with ``max_elements``, at most that many
tensor elements), except that a single request larger than that runs alone. A request
whose inputs cannot be batched (a scalar input, inputs disagreeing on their row count,
no inputs) always runs alone. Everything here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

BatchKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]
"""What must match for requests to share a batch: (name, dtype, trailing shape) per input.
The dtype itself, not its ``str``: built on every request, and a builtin dtype is one
object, so keys compare by identity first."""


class Batchable(Protocol):
    """What the batcher needs to know of a queued request."""

    @property
    def rows(self) -> int:
        """Rows (axis-0 length) the request carries."""
        ...

    @property
    def batch_key(self) -> BatchKey | None:
        """Its :func:`batch_key`; None when it must run alone."""
        ...


T = TypeVar("T", bound=Batchable)


def batch_key(inputs: Mapping[str, np.ndarray]) -> BatchKey | None:
    """The key requests must share to be batched with these inputs; None: run alone."""
    if not inputs:
        return None
    if len(inputs) == 1:  # most models: no set, list or sort per request
        ((name, array),) = inputs.items()
        if array.ndim == 0:
            return None
        return ((name, array.dtype, array.shape[1:]),)
    leading: set[int] = set()
    parts = []
    for name, array in inputs.items():
        if array.ndim == 0:
            return None
        leading.add(array.shape[0])
        parts.append((name, array.dtype, tuple(array.shape[1:])))
    if len(leading) != 1:
        return None
    return tuple(sorted(parts))


def row_count(inputs: Mapping[str, np.ndarray]) -> int:
    """Rows the request carries: the shared axis-0 length (1 when there is none)."""
    for array in inputs.values():
        if array.ndim > 0:
            return int(array.shape[0])
    return 1


@dataclass(frozen=True, slots=True)
class Selection(Generic[T]):
    """The requests chosen for the next batch, in dispatch order."""

    entries: list[T]
    rows: int
    is_ready: bool
    """True when waiting cannot make this batch better: it is full, stands alone, or has
    reached a preferred size."""


def select_batch(
    candidates: Iterable[T],
    *,
    max_rows: int,
    preferred_sizes: Sequence[int] = (),
    is_batching: bool = True,
    max_elements: int | None = None,
) -> Selection[T] | None:
    """Choose the next batch from ``candidates`` (already in priority order).

    The first candidate heads the batch. Later ones join in order when they share its
    key and still fit under ``max_rows``; candidates with other keys are passed over
    (they stay queued for a later batch), and the first one that does not fit ends the
    search, so requests of one key keep their order. If a prefix of the batch adds up to
    one of ``preferred_sizes``, the longest such prefix is returned, ready at once.
    ``max_elements`` bounds the batch's tensor elements (all inputs), so batching never
    builds arrays larger than one request may be.
    """
    iterator = iter(candidates)
    head = next(iterator, None)
    if head is None:
        return None
    key = head.batch_key
    if max_elements is not None and key is not None:
        # Requests of one key share their trailing shapes: elements grow by row.
        per_row = sum(math.prod(shape) for _, _, shape in key)
        if per_row > 0:
            max_rows = min(max_rows, max(1, max_elements // per_row))
    if not is_batching or key is None or head.rows >= max_rows:
        return Selection([head], head.rows, is_ready=True)
    chosen = [head]
    rows = head.rows
    is_blocked = False
    for candidate in iterator:
        if rows >= max_rows:
            break
        if candidate.batch_key != key:
            continue
        if rows + candidate.rows > max_rows:
            is_blocked = True
            break
        chosen.append(candidate)
        rows += candidate.rows
    if rows >= max_rows or is_blocked:
        return Selection(chosen, rows, is_ready=True)
    preferred = {size for size in preferred_sizes if size <= max_rows}
    if preferred:
        prefix_rows = 0
        best = 0
        for i, entry in enumerate(chosen, start=1):
            prefix_rows += entry.rows
            if prefix_rows in preferred:
                best = i
        if best:
            kept = chosen[:best]
            return Selection(kept, sum(e.rows for e in kept), is_ready=True)
    return Selection(chosen, rows, is_ready=False)


def concat_inputs(parts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One batch from several requests' inputs (which share a :func:`batch_key`)."""
    if len(parts) == 1:
        return dict(parts[0])
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def split_outputs(
    outputs: Mapping[str, np.ndarray], row_counts: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Each request's share of a batch's outputs, by its row count.

    Raises ``ValueError`` when an output's axis 0 does not match the batch's rows.
    """
    if len(row_counts) == 1:
        return [dict(outputs)]
    total = sum(row_counts)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise ValueError(
                f"output {name!r} has shape {array.shape}; a batch of {total} rows "
                f"needs {total} along axis 0"
            )
    # Slices along axis 0: the views np.split would return, without its Python layers
    # (array_split and a swapaxes per piece) on every batch.
    parts: list[dict[str, np.ndarray]] = []
    start = 0
    for rows in row_counts:
        end = start + rows
        parts.append({name: array[start:end] for name, array in outputs.items()})
        start = end
    return parts
