"""Showing results: the terminal table, JSON and CSV files, a plot, and the live progress line."""

from __future__ import annotations

import asyncio
import csv
import importlib
import importlib.util
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TextIO

import orjson

from modelyard.bench.errors import BenchConfigError, EngineUnavailableError
from modelyard.bench.results import BenchResult

_FIELDS = tuple(f.name for f in fields(BenchResult))
_INT_FIELDS = frozenset({"concurrency", "requests", "ok"})
_TEXT_FIELDS = frozenset({"engine", "mode"})
_DICT_FIELDS = frozenset({"errors", "requests_by_model"})


def format_table(results: Sequence[BenchResult]) -> str:
    """A fixed-width table: concurrency, (target rate,) mean and p99 ms, QPS, errors, client CPU."""
    with_rate = any(r.target_rate is not None for r in results)
    header = ["concurrency", *(["rate/s"] if with_rate else []), "requests"]
    header += ["mean ms", "p99 ms", "QPS", "client cpu", "errors"]
    rows = [header]
    for r in results:
        row = [str(r.concurrency)]
        if with_rate:
            row.append("-" if r.target_rate is None else f"{r.target_rate:g}")
        row += [str(r.requests), _ms(r.mean_ms), _ms(r.p99_ms), f"{r.qps:.1f}"]
        row += [f"{r.client_cpu_fraction:.0%}", format_errors(r.errors) or "0"]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    # Numbers right-aligned; the errors column, last, left-aligned.
    lines = [
        "  ".join([*(c.rjust(w) for c, w in zip(row[:-1], widths, strict=False)), row[-1]])
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def format_errors(errors: Mapping[str, int]) -> str:
    """``503=12;timeout=1``; empty when there were none."""
    return ";".join(f"{code}={count}" for code, count in errors.items())


def write_json(
    results: Sequence[BenchResult], path: Path | str, *, config: Mapping[str, Any] | None = None
) -> None:
    """Write ``{"config": ..., "results": [...]}``; :func:`load_json` reads it back."""
    document = {"config": dict(config or {}), "results": [r.to_dict() for r in results]}
    Path(path).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")


def load_json(path: Path | str) -> list[BenchResult]:
    """Results from a file :func:`write_json` wrote."""
    document = orjson.loads(Path(path).read_bytes())
    return [BenchResult.from_dict(item) for item in document["results"]]


def write_csv(results: Sequence[BenchResult], path: Path | str) -> None:
    """One row per phase, one column per :class:`BenchResult` field; dict cells as ``k=v;…``."""
    with Path(path).open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(_FIELDS)
        for r in results:
            data = r.to_dict()
            writer.writerow(_csv_cell(name, data[name]) for name in _FIELDS)


def load_csv(path: Path | str) -> list[BenchResult]:
    """Results from a file :func:`write_csv` wrote."""
    with Path(path).open(newline="", encoding="utf-8") as stream:
        return [
            BenchResult.from_dict({k: _parse_cell(k, v) for k, v in row.items()})
            for row in csv.DictReader(stream)
        ]


def require_matplotlib() -> None:
    """Raise :class:`EngineUnavailableError` unless matplotlib can be imported."""
    if importlib.util.find_spec("matplotlib") is None:
        raise EngineUnavailableError(
            "--plot needs matplotlib, which is not installed (pip install matplotlib)"
        )


def write_plot(results: Sequence[BenchResult], path: Path | str) -> None:
    """Plot p50 and p99 latency against achieved QPS, one point per phase, to a PNG."""
    require_matplotlib()
    # Imported by name so the module (and mypy) never needs matplotlib installed.
    importlib.import_module("matplotlib").use("Agg")  # no display needed; must precede pyplot
    plt = importlib.import_module("matplotlib.pyplot")

    points = [r for r in results if r.p50_ms is not None]
    if not points:
        raise BenchConfigError("nothing to plot: no phase had a successful request")
    figure, axes = plt.subplots(figsize=(7, 4.5))
    try:
        qps = [r.qps for r in points]
        axes.plot(qps, [r.p50_ms for r in points], marker="o", label="p50")
        axes.plot(qps, [r.p99_ms for r in points], marker="s", label="p99")
        for r in points:
            axes.annotate(f"c={r.concurrency}", (r.qps, r.p99_ms or 0.0), fontsize=8)
        axes.set_xlabel("throughput (requests/s)")
        axes.set_ylabel("latency (ms)")
        axes.set_title("modelyard bench: latency vs throughput")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)


class ProgressLine:
    """Rewrites one stderr line twice a second: requests done and the current rate."""

    def __init__(
        self,
        label: str,
        done: Callable[[], int],
        *,
        stream: TextIO | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self._label = label
        self._done = done
        self._stream = stream
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start refreshing; call from inside the running loop."""
        self._task = asyncio.create_task(self._refresh())

    async def stop(self) -> None:
        """Stop refreshing and clear the line."""
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            # Re-raise only if *we* are being cancelled, not just the refresh task.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        self._task = None
        self._write("\r\x1b[2K")

    async def _refresh(self) -> None:
        last_done, last_at = self._done(), time.perf_counter()
        while True:
            await asyncio.sleep(self._interval_s)
            done, now = self._done(), time.perf_counter()
            rate = (done - last_done) / (now - last_at) if now > last_at else 0.0
            last_done, last_at = done, now
            self._write(f"\r\x1b[2K[{self._label}] {done} requests, {rate:.0f} req/s")

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text)
        stream.flush()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _csv_cell(name: str, value: Any) -> str:
    if name in _DICT_FIELDS:
        return format_errors(value)
    return "" if value is None else str(value)


def _parse_cell(name: str, text: str) -> Any:
    if name in _DICT_FIELDS:
        pairs = (item.rsplit("=", 1) for item in text.split(";") if item)
        return {code: int(count) for code, count in pairs}
    if name in _TEXT_FIELDS:
        return text
    if text == "":
        return None
    return int(text) if name in _INT_FIELDS else float(text)
