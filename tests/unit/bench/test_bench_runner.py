"""Closed and open loop against the KServe v2 double (see conftest.py)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from modelyard.bench import BenchConfig, MixSpec, TargetError, run_bench
from modelyard.bench.errors import BenchConfigError
from modelyard.bench.runner import Phase, prepare_workload, run_phase

from ._kserve import READY_MODELS, RunningServer

HTTP_CLIENTS = ("raw", "aiohttp")


def _config(server: RunningServer, **overrides: Any) -> BenchConfig:
    settings: dict[str, Any] = {"url": server.url, "warmup_s": 0.0, "requests": 100}
    return BenchConfig(**(settings | overrides))


@pytest.mark.parametrize("client", HTTP_CLIENTS)
async def test_closed_loop_sends_exactly_the_requested_count(
    kserve: RunningServer, client: str
) -> None:
    config = _config(kserve, models=("add",), concurrency=(4,), requests=200, http_client=client)
    [result] = await run_bench(config)
    assert (result.requests, result.ok, result.errors) == (200, 200, {})
    assert kserve.state.infer_counts["add"] == 200
    assert result.mode == "closed"
    assert result.engine == f"python/{client}"
    # QPS is the count over the measured window, and the window is at least 200 latencies / 4.
    assert result.qps == pytest.approx(200 / result.duration_s)
    assert result.qps <= 4 / (result.mean_ms or 0.0) * 1000 * 1.2
    assert result.mean_ms is not None
    assert result.p50_ms is not None
    assert result.p99_ms is not None
    assert result.max_ms is not None
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
    assert result.client_cpu_s > 0
    assert result.client_cpu_fraction > 0


async def test_closed_loop_for_a_duration(kserve: RunningServer) -> None:
    config = _config(kserve, models=("add",), concurrency=(2,), requests=None, duration_s=0.4)
    [result] = await run_bench(config)
    assert 0.4 <= result.duration_s < 0.6
    assert result.requests == kserve.state.infer_counts["add"] > 10


async def test_warmup_requests_are_not_counted(kserve: RunningServer) -> None:
    config = _config(kserve, models=("add",), concurrency=(2,), requests=50, warmup_s=0.2)
    [result] = await run_bench(config)
    assert result.requests == 50
    assert kserve.state.infer_counts["add"] > 50


async def test_errors_are_counted_by_code(kserve: RunningServer) -> None:
    config = _config(kserve, models=("add", "flaky"), concurrency=(2,), requests=200)
    [result] = await run_bench(config)
    assert result.requests == 200
    assert result.errors == {"503": result.requests_by_model["flaky"]}
    assert result.ok == result.requests_by_model["add"]
    assert 60 < result.ok < 140


async def test_only_failures_leave_latency_empty(kserve: RunningServer) -> None:
    [result] = await run_bench(_config(kserve, models=("flaky",), requests=20))
    assert (result.ok, result.errors, result.mean_ms, result.p99_ms) == (0, {"503": 20}, None, None)


async def test_timeouts_are_counted(kserve: RunningServer) -> None:
    kserve.state.slow_s = 0.25
    config = _config(kserve, models=("slow",), requests=3, request_timeout_s=0.05)
    [result] = await run_bench(config)
    assert result.errors == {"timeout": 3}


async def test_connection_failures_are_counted(kserve: RunningServer) -> None:
    workload = await prepare_workload(_config(kserve, models=("add",)))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on `port` now.
    config = BenchConfig(url=f"http://127.0.0.1:{port}", warmup_s=0, requests=5, models=("add",))
    result = await run_phase(config, workload, Phase(concurrency=1, rate=None))
    assert result.errors == {"connection_error": 5}


async def test_concurrency_sweep_gives_one_result_per_level(kserve: RunningServer) -> None:
    seen: list[int] = []
    config = _config(kserve, models=("add",), concurrency=(1, 4), requests=40)
    results = await run_bench(config, on_result=lambda r: seen.append(r.concurrency))
    assert [r.concurrency for r in results] == seen == [1, 4]
    assert all(r.requests == 40 for r in results)


async def test_open_loop_reaches_the_target_rate(kserve: RunningServer) -> None:
    config = _config(
        kserve, models=("add",), rates=(200.0,), concurrency=(8,), requests=None, duration_s=1.0
    )
    [result] = await run_bench(config)
    assert result.mode == "open"
    assert result.target_rate == 200.0
    # Poisson: 200 expected arrivals, standard deviation ~14.
    assert 150 <= result.requests <= 250
    assert result.qps == pytest.approx(200, rel=0.25)
    assert result.errors == {}


async def test_open_loop_latency_includes_queueing(kserve: RunningServer) -> None:
    """A server that can serve 50/s, offered 100/s through one connection, falls behind.

    Measured from each request's scheduled time, latency grows with the backlog; a closed loop
    (or an open loop that timed from the actual send) would report about the service time.
    """
    kserve.state.slow_s = 0.02
    config = _config(
        kserve, models=("slow",), rates=(100.0,), concurrency=(1,), requests=None, duration_s=0.5
    )
    [result] = await run_bench(config)
    assert result.p50_ms is not None
    assert result.p50_ms > 3 * 20


async def test_open_loop_replays_trace_timing(kserve: RunningServer, tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("0.0,add\n0.1,ints\n0.2,add\n0.3,text\n")
    config = BenchConfig(
        url=kserve.url,
        mix=MixSpec.parse(f"trace:{path}"),
        replay_trace_timing=True,
        concurrency=(2,),
        warmup_s=0,
        duration_s=5,
    )
    [result] = await run_bench(config)
    assert result.requests_by_model == {"add": 2, "ints": 1, "text": 1}
    assert result.errors == {}
    assert 0.3 <= result.duration_s < 1.0


async def test_discovery_takes_ready_models_and_falls_back_to_the_model_list(
    kserve: RunningServer,
) -> None:
    workload = await prepare_workload(BenchConfig(url=kserve.url))
    assert workload.mix.models == READY_MODELS
    kserve.state.has_repository_index = False
    workload = await prepare_workload(BenchConfig(url=kserve.url))
    assert workload.mix.models == READY_MODELS


async def test_generated_payloads_are_accepted_by_the_server(kserve: RunningServer) -> None:
    config = _config(kserve, models=("add", "ints", "text"), requests=30)
    [result] = await run_bench(config)
    assert result.errors == {}
    assert orjson.loads(kserve.state.last_body["add"])["inputs"][0]["shape"] == [1, 4]


async def test_payload_file_replaces_the_generated_body(
    kserve: RunningServer, tmp_path: Path
) -> None:
    path = tmp_path / "ints.json"
    path.write_bytes(b'{"inputs":[{"name":"i","shape":[2],"datatype":"INT64","data":[40,2]}]}')
    config = _config(kserve, models=("ints",), requests=3, payload_files={"ints": path})
    [result] = await run_bench(config)
    assert result.ok == 3
    assert kserve.state.last_body["ints"] == path.read_bytes()


async def test_payload_for_an_unbenchmarked_model_is_an_error(
    kserve: RunningServer, tmp_path: Path
) -> None:
    config = _config(kserve, models=("add",), payload_files={"other": tmp_path / "x.json"})
    with pytest.raises(BenchConfigError, match="other"):
        await run_bench(config)


async def test_unknown_model_and_unreachable_server_stop_the_run(kserve: RunningServer) -> None:
    with pytest.raises(TargetError, match="404 model nope not found"):
        await run_bench(_config(kserve, models=("nope",)))
    with pytest.raises(TargetError, match="cannot reach"):
        await run_bench(BenchConfig(url="http://127.0.0.1:9", request_timeout_s=1))


async def test_zipf_mix_reaches_the_server_skewed(kserve: RunningServer) -> None:
    config = _config(kserve, models=("add", "ints", "text"), mix=MixSpec.parse("zipf:1.5"))
    [result] = await run_bench(config)
    counts = kserve.state.infer_counts
    assert counts["add"] > counts["ints"] > counts["text"]
    assert result.requests_by_model == {m: counts[m] for m in ("add", "ints", "text")}
