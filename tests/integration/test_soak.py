"""The soak (``bench/soak.py``) for 60 s against a real server, with its assertions.

20 models under budget pressure; inferences, bad requests, loads, unloads and a worker
SIGKILLed every 8 s. Every request must be answered; the only 5xx allowed is a 503 for
an inference on a model whose worker was just killed (``WorkerCrashedError`` for the
calls in flight, then ``ModelNotReadyError``/``CircuitOpenError`` while it restarts);
after every model is unloaded and the server has settled, its descriptors, memfds and
``/dev/shm`` files are back to the baseline, and its RSS has not grown after warm-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DURATION_S = 60
RSS_GROWTH_LIMIT = 0.10
"""Server + fork server RSS growth after warm-up; 60 s is short, so wider than the 5 %
target of the 30-minute soak (BENCHMARKS.md)."""


# The suite's 120 s per-test limit is shorter than the soak itself plus its set-up on a
# loaded machine (CI beside other jobs: cut at 120 s); its subprocess has its own limit.
@pytest.mark.timeout(DURATION_S + 420)
def test_soak_answers_everything_and_leaks_nothing(tmp_path: Path) -> None:
    out, plot = tmp_path / "soak.json", tmp_path / "soak.png"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO / "bench")])}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--duration-s",
            str(DURATION_S),
            "--kill-every-s",
            "8",
            "--out",
            str(out),
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
        timeout=DURATION_S + 400,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    outcomes = result["outcomes"]

    assert result["sent"] == result["answered"], (result["sent"], result["answered"])
    assert result["unexpected"] == [], result["unexpected"][:10]
    assert result["wrong_answers"] == 0
    assert outcomes["infer"]["200"] > 200
    assert result["kills"] >= 3
    for op, statuses in outcomes.items():
        fives = {s: n for s, n in statuses.items() if s.startswith("5")}
        allowed = {"503_after_kill"} if op == "infer" else {"503"} if op == "load" else set()
        assert set(fives) <= allowed, (op, fives)
    assert {"bad:malformed_json", "bad:unknown_model", "load", "unload"} <= set(outcomes)

    assert result["core_rss_growth_after_warmup"] < RSS_GROWTH_LIMIT
    base, end = result["baseline"], result["end"]
    # Every model unloaded at the end: what is left is the idle spare worker(s) the
    # server keeps ready (spare_workers), as many as at the baseline.
    assert end["workers"] == base["workers"] <= 1, (base["workers"], end["workers"])
    kinds_base, kinds_end = base["fd_kinds"], end["fd_kinds"]
    changed = {
        k: (kinds_base.get(k, 0), kinds_end.get(k, 0))
        for k in kinds_base.keys() | kinds_end.keys()
        if kinds_base.get(k, 0) != kinds_end.get(k, 0)
    }
    for key in ("server_fds", "tree_fds", "memfds", "shm_files"):
        assert end[key] == base[key], (key, base[key], end[key], changed)
    assert plot.stat().st_size > 10_000
