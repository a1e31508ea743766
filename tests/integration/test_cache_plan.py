"""`modelyard plan` end to end: a server records its request log, the CLI replays it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.cli import build_parser
from modelyard.manager.eviction import POLICY_NAMES
from modelyard.simulation.traces import read_request_log
from tests.servers import running_server, write_config

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}


@pytest.mark.slow
async def test_a_recorded_request_log_is_planned_per_policy_and_budget(
    model_root: Path, tmp_path: Path
) -> None:
    names = ["a", "b", "c"]
    models = [{"name": n, "path": "add", "isolation": "inline"} for n in names]
    log = tmp_path / "requests.jsonl"
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(model_root),
        request_log={"path": str(log)},
    )
    sequence = ["a", "a", "b", "a", "c", "a", "b", "a"] * 3
    async with running_server(cfg) as (_, client):
        for name in sequence:
            r = await client.post(f"/v2/models/{name}/infer", json=BODY)
            assert r.status_code == 200
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    requests = [r for r in rows if "event" not in r]
    loads = [r for r in rows if r.get("event") == "load"]
    assert [r["model"] for r in requests] == sequence
    assert {r["model"] for r in loads} == set(names)
    assert all(r["bytes"] > 0 and r["load_s"] > 0 for r in loads)

    trace = read_request_log(log)
    assert len(trace.requests) == len(sequence)
    assert trace.models["a"].size_bytes == next(r["bytes"] for r in loads if r["model"] == "a")

    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "modelyard.cli", "plan", "--trace", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    plan = json.loads(out.stdout)
    policies = {row["policy"] for row in plan}
    assert policies == {*POLICY_NAMES, "belady"}
    budgets = sorted({row["budget_mib"] for row in plan})
    assert len(budgets) >= 2
    for row in plan:
        assert row["requests"] == len(sequence)
        assert row["cold_starts"] >= 3, "each model loads at least once"
    # With room for all three models, every policy loads each exactly once.
    roomy = [row for row in plan if row["budget_mib"] == budgets[-1]]
    assert all(row["cold_starts"] == 3 for row in roomy)
    # The smallest budget costs at least as many cold starts as the biggest.
    tight = [row for row in plan if row["budget_mib"] == budgets[0]]
    assert all(t["cold_starts"] >= 3 for t in tight)

    table = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "modelyard.cli", "plan", "--trace", str(log), "--budget-mb", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "COLD-START s" in table.stdout
    assert "gdsf-decay" in table.stdout
    assert "belady" in table.stdout


def _plan_cli(*argv: str) -> int:
    args = build_parser().parse_args(["plan", *argv])
    code: int = args.func(args)
    return code


def test_plan_refuses_a_missing_file_and_an_unknown_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _plan_cli("--trace", str(tmp_path / "nope")) == 2
    assert "is not a file" in capsys.readouterr().err
    log = tmp_path / "log.jsonl"
    log.write_text('{"t": 0, "model": "a"}\n')
    assert _plan_cli("--trace", str(log), "--policies", "mru") == 2
    assert "unknown policy mru" in capsys.readouterr().err
    log.write_text("not json\n")
    assert _plan_cli("--trace", str(log)) == 2
    assert "no request lines" in capsys.readouterr().err
    for bad in ("-1", "two"):
        with pytest.raises(SystemExit) as exc:
            _plan_cli("--trace", str(log), "--load-slots", bad)
        assert exc.value.code == 2
        assert "not a number of load slots" in capsys.readouterr().err
