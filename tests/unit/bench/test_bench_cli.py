"""``modelyard bench`` flags, exit codes and output files."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from modelyard.bench.cli import add_bench_parser, config_from_args, run_bench_command
from modelyard.bench.errors import BenchConfigError
from modelyard.bench.workload import MixSpec

from ._kserve import RunningServer


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="modelyard")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


def test_defaults_describe_a_closed_loop_against_localhost() -> None:
    args = _parse()
    assert args.func is run_bench_command
    config = config_from_args(args)
    assert config.url == "http://127.0.0.1:8080"
    assert (config.concurrency, config.duration_s, config.warmup_s) == ((1,), 10.0, 2.0)
    assert (config.is_open_loop, config.engine, config.http_client) == (False, "python", "raw")
    assert config.models == ()


def test_flags_map_onto_the_config(tmp_path: Path) -> None:
    args = _parse(
        "--models",
        "a, b",
        "--mix",
        "zipf:1.3",
        "--concurrency",
        "1,8,32",
        "--requests",
        "500",
        "--payload",
        f"a={tmp_path / 'a.json'}",
        "--grpc",
        "127.0.0.1:8081",
    )
    config = config_from_args(args)
    assert config.models == ("a", "b")
    assert config.mix == MixSpec(kind="zipf", zipf_s=1.3)
    assert config.concurrency == (1, 8, 32)
    assert config.requests == 500
    assert config.payload_files == {"a": tmp_path / "a.json"}
    assert config.grpc_target == "127.0.0.1:8081"


def test_rate_makes_an_open_loop_with_more_connections() -> None:
    config = config_from_args(_parse("--rate", "100,200"))
    assert (config.rates, config.concurrency, config.is_open_loop) == ((100.0, 200.0), (64,), True)
    config = config_from_args(_parse("--mix", "trace:t.csv", "--rate", "trace"))
    assert (config.replay_trace_timing, config.rates) == (True, ())


BAD_FLAGS = {
    "mix": ["--mix", "pareto"],
    "concurrency": ["--concurrency", "1,x"],
    "zero-concurrency": ["--concurrency", "0"],
    "payload": ["--payload", "nofile"],
    "wrk-open-loop": ["--engine", "wrk", "--rate", "10"],
    "trace-timing-without-trace": ["--rate", "trace"],
}


@pytest.mark.parametrize("argv", BAD_FLAGS.values(), ids=list(BAD_FLAGS))
def test_bad_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BenchConfigError):
        config_from_args(_parse(*argv))
    assert run_bench_command(_parse(*argv)) == 2
    assert capsys.readouterr().err.startswith("modelyard bench: ")


def test_unreachable_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_bench_command(_parse("--url", "http://127.0.0.1:9", "--timeout", "1")) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_run_prints_the_table_and_writes_files(
    threaded_kserve: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_csv = tmp_path / "out.json", tmp_path / "out.csv"
    argv = ["--url", threaded_kserve.url, "--models", "add,flaky", "--concurrency", "1,4"]
    argv += ["--requests", "40", "--warmup", "0", "--json", str(out_json), "--csv", str(out_csv)]
    assert run_bench_command(_parse(*argv)) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["concurrency", "requests"]
    assert [line.split()[:2] for line in table[1:]] == [["1", "40"], ["4", "40"]]
    document = json.loads(out_json.read_text())
    assert document["config"]["models"] == ["add", "flaky"]
    assert [r["requests"] for r in document["results"]] == [40, 40]
    assert all(r["ok"] + r["errors"]["503"] == 40 for r in document["results"])
    rows = list(csv.DictReader(out_csv.open()))
    assert [row["concurrency"] for row in rows] == ["1", "4"]
    assert all(row["errors"].startswith("503=") for row in rows)
