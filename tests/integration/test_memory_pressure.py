"""20 models whose footprints sum to about 3x the budget, under skewed concurrent load.

Every request must get a correct answer (the models are deterministic, so answers are
checked against ONNX Runtime in the test process); the budget invariant is sampled
throughout; the whole process tree's memory stays within budget plus a fixed overhead.

Overhead, documented: the server process and the fork server, measured idle before
the run (their PSS), plus 64 MiB of slack for allocator growth inside workers after
their footprint was measured. Memory is counted as PSS, summed over the process tree,
so pages shared between the fork server and its workers count once: RSS would count
the interpreter and ONNX Runtime once per worker although the kernel holds them once.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from modelyard.examples.mlp import build_mlp_onnx
from tests.servers import running_server, write_config

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
N_MODELS = 20
DURATION_S = 30.0
SLACK_BYTES = 64 * MIB


def _tree_pss() -> int:
    me = psutil.Process()
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            continue
    return total


async def test_many_models_under_a_third_of_their_footprint(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sizes = np.linspace(4, 16, N_MODELS)
    names = [f"m{i:02d}" for i in range(N_MODELS)]
    x = rng.random((1, 64), dtype=np.float32)
    expected: dict[str, list[float]] = {}
    for name, mb, seed in zip(names, sizes, range(N_MODELS), strict=True):
        path = build_mlp_onnx(tmp_path / "repo" / name / "1" / "model.onnx", float(mb), seed=seed)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected[name] = sess.run(None, {"input": x})[0].ravel().tolist()
    # A measured footprint is about 1.8x the weights plus 6 MiB (see test_budget).
    footprint_total = sum(1.8 * mb + 6 for mb in sizes) * MIB
    budget_mb = round(footprint_total / 3 / MIB)
    models = [{"name": n, "path": n} for n in names]
    cfg = write_config(
        tmp_path,
        models,
        model_repository=str(tmp_path / "repo"),
        devices=[{"name": "cpu", "memory_budget_mb": budget_mb}],
    )
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    # Zipf-like popularity: a few hot models, a long tail of cold ones.
    weights = [1.0 / (i + 1) ** 1.1 for i in range(N_MODELS)]
    async with running_server(cfg) as (app, client):
        idle_pss = _tree_pss()
        budget = app.manager.budget.device("cpu")
        failures: list[str] = []
        answered = 0
        peak_pss = 0
        violations: list[int] = []
        stop = asyncio.Event()

        async def user(seed: int) -> None:
            nonlocal answered
            pick = random.Random(seed)
            while not stop.is_set():
                name = pick.choices(names, weights)[0]
                r = await client.post(f"/v2/models/{name}/infer", json=body)
                if r.status_code != 200:
                    failures.append(f"{name}: {r.status_code} {r.text}")
                    continue
                got = r.json()["outputs"][0]["data"]
                if not np.allclose(got, expected[name], rtol=1e-4, atol=1e-5):
                    failures.append(f"{name}: wrong answer")
                answered += 1

        async def sampler() -> None:
            nonlocal peak_pss
            while not stop.is_set():
                if budget.reserved_bytes > budget.budget_bytes:
                    violations.append(budget.reserved_bytes)
                peak_pss = max(peak_pss, await asyncio.to_thread(_tree_pss))
                await asyncio.sleep(0.2)

        tasks = [asyncio.create_task(user(i)) for i in range(8)]
        watcher = asyncio.create_task(sampler())
        await asyncio.sleep(DURATION_S)
        stop.set()
        await asyncio.gather(*tasks, watcher)

        stats = (await client.get("/v2/stats")).json()
        evictions = sum(m["evictions"] for m in stats["models"])
        loads = sum(m["loads"] for m in stats["models"])
        assert failures == [], failures[:5]
        assert violations == []
        assert answered > 100
        assert evictions > 0
        assert loads > N_MODELS // 2
        limit = budget.budget_bytes + idle_pss + SLACK_BYTES
        assert peak_pss <= limit, (peak_pss / MIB, limit / MIB, idle_pss / MIB)
        print(
            f"\n{answered} answers in {DURATION_S:.0f} s, {loads} loads, {evictions} evictions; "
            f"budget {budget_mb} MiB, idle tree {idle_pss / MIB:.0f} MiB, "
            f"peak tree PSS {peak_pss / MIB:.0f} MiB (limit {limit / MIB:.0f})"
        )
