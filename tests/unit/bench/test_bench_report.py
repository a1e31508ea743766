"""The terminal table, JSON/CSV round trips, the plot and the progress line."""

from __future__ import annotations

import asyncio
import csv
import importlib.util
import io
import json
import sys
from pathlib import Path

import pytest

from modelyard.bench.errors import EngineUnavailableError
from modelyard.bench.report import (
    ProgressLine,
    format_table,
    load_csv,
    load_json,
    write_csv,
    write_json,
    write_plot,
)
from modelyard.bench.results import BenchResult, Recorder

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _results() -> list[BenchResult]:
    recorder = Recorder()
    for latency_ms in range(1, 101):
        recorder.record("a", latency_ms * 1_000_000, None)
    recorder.record("b", 0, "503")
    recorder.record("b", 0, "timeout")
    closed = recorder.summarise(
        engine="python/raw",
        mode="closed",
        concurrency=8,
        target_rate=None,
        duration_s=2.0,
        client_cpu_s=0.5,
    )
    empty = Recorder().summarise(
        engine="python/raw",
        mode="open",
        concurrency=64,
        target_rate=50.0,
        duration_s=1.0,
        client_cpu_s=0.0,
    )
    return [closed, empty]


def test_summary_statistics() -> None:
    closed, empty = _results()
    assert (closed.requests, closed.ok, closed.qps) == (102, 100, 51.0)
    assert closed.errors == {"503": 1, "timeout": 1}
    assert closed.requests_by_model == {"a": 100, "b": 2}
    assert closed.mean_ms == pytest.approx(50.5)
    assert closed.p50_ms == pytest.approx(50.5)
    assert closed.p99_ms == pytest.approx(99.01)
    assert closed.max_ms == 100.0
    assert closed.client_cpu_fraction == 0.25
    assert closed.client_cpu_ms_per_request == pytest.approx(500 / 102)
    assert (empty.requests, empty.mean_ms, empty.client_cpu_ms_per_request) == (0, None, None)


def test_table_shows_the_key_columns() -> None:
    table = format_table(_results())
    header, closed, empty = table.splitlines()
    for column in ("concurrency", "rate/s", "mean ms", "p99 ms", "QPS", "errors"):
        assert column in header
    assert closed.split()[:3] == ["8", "-", "102"]
    assert closed.endswith("503=1;timeout=1")
    assert "50.500" in closed
    assert empty.split()[:2] == ["64", "50"]


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    results = _results()
    write_json(results, path, config={"url": "http://x"})
    document = json.loads(path.read_text())
    assert document["config"] == {"url": "http://x"}
    assert document["results"][0]["errors"] == {"503": 1, "timeout": 1}
    assert load_json(path) == results


def test_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    results = _results()
    write_csv(results, path)
    rows = list(csv.DictReader(path.open()))
    assert rows[0]["errors"] == "503=1;timeout=1"
    assert rows[1]["mean_ms"] == ""
    assert load_csv(path) == results


def test_plot_without_matplotlib_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes the import fail as if it were not installed.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(EngineUnavailableError, match="pip install matplotlib"):
        write_plot(_results(), tmp_path / "plot.png")


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    write_plot(_results(), path)
    assert path.read_bytes().startswith(b"\x89PNG")


async def test_progress_line_reports_count_and_rate() -> None:
    stream = io.StringIO()
    done = 0
    progress = ProgressLine("c=1", lambda: done, stream=stream, interval_s=0.02)
    progress.start()
    for _ in range(5):
        done += 10
        await asyncio.sleep(0.02)
    await progress.stop()
    text = stream.getvalue()
    assert "[c=1]" in text
    assert "req/s" in text
    assert text.endswith("\r\x1b[2K")
