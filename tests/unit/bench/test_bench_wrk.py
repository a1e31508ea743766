"""The wrk engine: its Lua script, its output parser, and (when wrk is installed) a real run."""

from __future__ import annotations

import shutil

import pytest

from modelyard.bench import BenchConfig, run_bench
from modelyard.bench.client import Endpoint
from modelyard.bench.wrk import WrkSummary, build_lua_script, parse_wrk_output, summary_to_result

from ._kserve import RunningServer

HAS_WRK = shutil.which("wrk") is not None

WRK_OUTPUT = """\
Running 1s test @ http://127.0.0.1:8080
  1 threads and 4 connections
MODELYARD_WRK {"requests":1000,"duration_us":1000000,"connect_errors":0,"read_errors":2,\
"write_errors":0,"timeout_errors":1,"mean_us":812.5,"p50_us":700,"p90_us":1200,\
"p99_us":2500,"max_us":4000,"codes":{"200":900,"503":100}}
"""


def test_script_posts_each_body_in_mix_order() -> None:
    endpoint = Endpoint.parse("http://127.0.0.1:8080/prefix")
    bodies = {"a": b'{"inputs":[]}', "b/c": b'{"x":"]]"}'}
    script = build_lua_script(endpoint, bodies, ["a", "b/c", "a"])
    assert 'local paths = {"/prefix/v2/models/a/infer", "/prefix/v2/models/b%2Fc/infer"}' in script
    assert "local sequence = {1,2,1}" in script
    # A body containing "]]" gets a long bracket of a higher level.
    assert '[=[{"x":"]]"}]=]' in script
    assert '[[{"inputs":[]}]]' in script
    assert 'thread:get("codes")' in script


def test_output_parses_into_a_result() -> None:
    summary = parse_wrk_output(WRK_OUTPUT)
    assert summary == WrkSummary(
        requests=1000,
        duration_us=1_000_000,
        connect_errors=0,
        read_errors=2,
        write_errors=0,
        timeout_errors=1,
        mean_us=812.5,
        p50_us=700,
        p90_us=1200,
        p99_us=2500,
        max_us=4000,
        codes={"200": 900, "503": 100},
    )
    result = summary_to_result(summary, concurrency=4, cpu_s=0.1)
    assert (result.engine, result.requests, result.ok, result.qps) == ("wrk", 1003, 900, 1000.0)
    assert result.errors == {"503": 100, "connection_error": 2, "timeout": 1}
    assert (result.mean_ms, result.p99_ms) == (0.8125, 2.5)
    assert result.client_cpu_fraction == pytest.approx(0.1)


def test_missing_summary_is_reported() -> None:
    with pytest.raises(Exception, match="wrk printed no summary"):
        parse_wrk_output("unable to connect to 127.0.0.1:1 Connection refused\n")


@pytest.mark.skipif(not HAS_WRK, reason="wrk is not installed")
async def test_wrk_engine_runs_against_the_server(kserve: RunningServer) -> None:
    config = BenchConfig(
        url=kserve.url,
        models=("add", "flaky"),
        engine="wrk",
        concurrency=(2,),
        duration_s=1,
        warmup_s=0,
    )
    [result] = await run_bench(config)
    served = kserve.state.infer_counts
    assert result.engine == "wrk"
    assert result.requests > 10
    # Requests in flight when wrk stops reach the server but not wrk's counts.
    assert 0 <= served["add"] - result.ok <= 2
    assert set(result.errors) == {"503"}
    assert 0 <= served["flaky"] - result.errors["503"] <= 2
