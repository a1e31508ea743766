"""What a request pays for ``ModelRecord`` reaching its first replica through properties.

The first replica's parts (instance, info, scheduler, in-flight batches, leases) live on
``record.first`` (a :class:`~modelyard.manager.replica.Replica`); the record reads and
writes them through properties so callers did not change. This times the accesses one
tensor request makes on its record (``Router.submit`` and the scheduler's execute: about
12), through the record and directly on ``record.first``, in one process and one run,
rounds interleaved. ``Router.submit`` and ``ModelRecord.is_ready`` read ``record.first``
directly for this reason.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python bench/bench_record_access.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.manager.records import ModelKey, ModelRecord, Replica
from modelyard.manager.states import ModelState


class _Alive:
    is_alive = True


def _through_record(record: ModelRecord, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        # Router.submit's checks and lease, execute's instance and in-flight count.
        if record.replicas or not record.is_ready:
            raise AssertionError
        _ = record.info
        _ = record.scheduler
        record.leases += 1
        record.route_leases += 1
        instance = record.instance
        _ = instance is not None and instance.is_alive
        record.in_flight += 1
        record.in_flight -= 1
        record.route_leases -= 1
        record.leases -= 1
    return (time.perf_counter() - start) / n


def _direct(record: ModelRecord, first: Replica, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        if record.replicas or not (
            record.state is ModelState.READY
            and first.instance is not None
            and first.instance.is_alive
        ):
            raise AssertionError
        _ = first.info
        _ = first.scheduler
        record.leases += 1
        first.leases += 1
        instance = first.instance
        _ = instance is not None and instance.is_alive
        first.in_flight += 1
        first.in_flight -= 1
        first.leases -= 1
        record.leases -= 1
    return (time.perf_counter() - start) / n


def main() -> None:
    """Print the median per-request cost both ways and their difference."""
    record = ModelRecord(ModelKey("m", "1"), ModelConfig(name="m", path="m"), Path("m"))
    record.state = ModelState.READY
    record.instance = _Alive()  # type: ignore[assignment]
    n = 200_000
    via, direct = [], []
    for _ in range(7):
        via.append(_through_record(record, n))
        direct.append(_direct(record, record.first, n))
    a, b = statistics.median(via), statistics.median(direct)
    print(f"through the record: {a * 1e9:.0f} ns per request")
    print(f"on record.first:    {b * 1e9:.0f} ns per request")
    print(f"properties cost:    {(a - b) * 1e9:.0f} ns per request ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
