"""The opt-in request log: one line per request and per load, bounded, read back as a trace."""

from __future__ import annotations

import json
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.request_log import RequestLog
from modelyard.simulation.traces import read_request_log
from tests.fakes.clock import FakeClock


def _record(name: str) -> ModelRecord:
    return ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))


def test_lines_are_written_on_the_managers_clock_and_read_back(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, 1024 * 1024, clock)
    a = _record("a")
    a.reserved_bytes = 5000
    a.timings.total_s = 0.25
    log.loaded(a)
    log.request(a)
    clock.advance(1.5)
    log.request(_record("b"))
    log.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {
        "t": 0.0, "model": "a", "version": "1", "event": "load", "bytes": 5000, "load_s": 0.25
    }  # fmt: skip
    assert rows[2] == {"t": 1.5, "model": "b", "version": "1"}
    trace = read_request_log(path)
    assert [(r.t, r.model) for r in trace.requests] == [(0.0, "a"), (1.5, "b")]
    assert trace.models["a"].size_bytes == 5000
    assert trace.models["a"].load_s == 0.25
    assert trace.models["b"].size_bytes > 0, "an unseen load gets the default size"


def test_the_log_stops_at_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, 200, FakeClock())
    for _ in range(50):
        log.request(_record("a"))
    log.close()
    assert 0 < path.stat().st_size <= 200
    assert path.read_text().endswith("\n"), "no line is cut in half"


def test_a_cut_off_log_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"t": 0, "model": "a"}\n{"t": 1, "model": "b"}\n{"t": 2, "mo')
    assert [r.model for r in read_request_log(path).requests] == ["a", "b"]


def test_a_loads_wait_for_room_is_not_logged_as_load_time(tmp_path: Path) -> None:
    # Live, 200 models under a tenth of their footprint: loads waited seconds for room,
    # and a replay that took that wait as the reload time queued it a second time
    # (Belady's MIN came out at 18x the live seconds waiting).
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, 1024 * 1024, FakeClock())
    a = _record("a")
    a.reserved_bytes = 5000
    a.timings.queue_wait_s = 4.0
    a.timings.total_s = 4.5
    log.loaded(a)
    log.request(a)
    log.close()
    assert json.loads(path.read_text().splitlines()[0])["load_s"] == 0.5
    assert read_request_log(path).models["a"].load_s == 0.5


def test_a_replay_takes_the_median_of_a_models_logged_loads(tmp_path: Path) -> None:
    # One load slowed by a busy host must not set every replayed load of the model.
    path = tmp_path / "requests.jsonl"
    rows = [{"t": 0, "event": "start", "load_slots": 3}, {"t": 0, "model": "a"}]
    rows += [
        {"t": 0, "model": "a", "event": "load", "bytes": 10, "load_s": s} for s in (0.1, 9.0, 0.2)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = read_request_log(path)
    assert trace.models["a"].load_s == 0.2
    assert trace.load_slots == 3
    path.write_text(json.dumps({"t": 0, "model": "a"}) + "\n")
    assert read_request_log(path).load_slots is None, "a log without the line: unknown"
