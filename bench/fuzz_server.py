"""Fuzz a real ``modelyard serve`` process with schemathesis cases from its OpenAPI document.

Run from the repository root::

    .venv/bin/python bench/fuzz_server.py                          # 100,000 cases
    .venv/bin/python bench/fuzz_server.py --cases 10000 --workers 2

The server runs as a subprocess (the CLI, as a user runs it) on a repository built at
run time: ``digits-logreg`` (scikit-learn → ONNX, preloaded), ``add`` (two versions) and
``types`` (one input of every datatype), all inline. ``--workers`` client processes
split the cases, each with its own seed (``--seed`` + worker index); the cases are the
ones ``tests/security/test_schemathesis.py`` sends: every operation of ``GET
/openapi.json``, positive and negative, plus the model operations on the real names.

Reported: cases sent, answers by status, 5xx answers, requests without an answer,
answers the document does not describe, whether the server process is still running,
and whether a good inference request succeeds after the run. Exit status 1 if any of
those is wrong. One JSON line goes to stdout, the same with the machine's description to
``bench/results/fuzz_server.json``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import _server
import httpx
import psutil

sys.path.insert(0, str(_server.REPO_ROOT))

from tests.integration.conftest import build_types_onnx
from tests.security.http_fuzz import fuzz

MODELS = [
    {"name": "digits-logreg", "path": "digits-logreg", "preload": True, "isolation": "inline"},
    {"name": "add", "path": "add", "isolation": "inline", "version_policy": {"all": True}},
    {"name": "types", "path": "types", "isolation": "inline"},
]
GOOD_REQUEST = {
    "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]
}
SHOWN = 20
"""Failures of each kind printed in full (all are counted)."""


def build_repository(root: Path) -> None:
    """The models of :data:`MODELS`, built from scratch."""
    from modelyard.examples.mlp import build_add_onnx
    from modelyard.examples.sklearn_models import export_sklearn_onnx, train_digits_classifier

    est = train_digits_classifier("logreg")
    export_sklearn_onnx(est, 64, root / "digits-logreg" / "1" / "model.onnx")
    build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
    build_add_onnx(root / "add" / "2" / "model.onnx", 2.0)
    build_types_onnx(root / "types" / "1" / "model.onnx")


def _worker(base_url: str, document: dict[str, Any], cases: int, seed: int) -> dict[str, Any]:
    report = fuzz(
        base_url, document, cases=cases, seed=seed, model_names=[m["name"] for m in MODELS]
    )
    return {
        "cases": report.cases,
        "statuses": dict(report.statuses),
        "server_errors": report.server_errors,
        "transport_errors": report.transport_errors,
        "nonconforming": report.nonconforming,
    }


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main() -> int:
    """Build, serve, fuzz, check the server is alive and still answers; print the figures."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--cases", type=int, default=100_000, help="cases in all (%(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="client processes (%(default)s)")
    parser.add_argument("--seed", type=int, default=20261201, help="first seed (%(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_repository(root)
        config = _server.write_config(root, MODELS)
        with _server.Server(config, root / "server.log") as server:
            document = httpx.get(server.url + "/openapi.json").json()
            shares = [args.cases // args.workers] * args.workers
            shares[0] += args.cases - sum(shares)
            started = time.monotonic()
            with ProcessPoolExecutor(args.workers) as pool:
                futures = [
                    pool.submit(_worker, server.url, document, n, args.seed + i)
                    for i, n in enumerate(shares)
                ]
                parts = [f.result() for f in futures]
            elapsed_s = time.monotonic() - started
            alive = _alive(server.pid)
            good = httpx.post(
                server.url + "/v2/models/digits-logreg/infer", json=GOOD_REQUEST, timeout=60
            ).status_code
    statuses: Counter[int] = Counter()
    for part in parts:
        statuses.update({int(k): v for k, v in part["statuses"].items()})
    failures = {
        kind: [line for part in parts for line in part[kind]]
        for kind in ("server_errors", "transport_errors", "nonconforming")
    }
    result = {
        "cases": sum(p["cases"] for p in parts),
        "workers": args.workers,
        "seed": args.seed,
        "elapsed_s": round(elapsed_s, 1),
        "statuses": dict(sorted(statuses.items())),
        **{kind: len(lines) for kind, lines in failures.items()},
        "server_alive": alive,
        "good_request_after": good,
    }
    for kind, lines in failures.items():
        for line in lines[:SHOWN]:
            print(f"{kind}: {line}", file=sys.stderr)
    print(json.dumps(result))
    _server.write_results("fuzz_server", {**result, "environment": _server.environment()})
    clean = not any(failures.values()) and alive and good == 200
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
