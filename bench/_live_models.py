"""Real ONNX models, a real in-process server and checked clients for the live cache runs.

Shared by ``bench_two_hundred.py`` and ``bench_prefetch_live.py``: MLPs built at run
time (their expected answers computed with ONNX Runtime here), a server started through
the same ``App`` the CLI uses (tests/servers.py) with real worker processes, clients
that send a fixed request sequence and check every answer, and a sampler of the
workers' PSS in a process of its own (tests/integration/pss_sampler.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import psutil

from modelyard.examples.mlp import build_mlp_onnx
from tests.integration.pss_sampler import sample_loop

MIB = 1024 * 1024
N_IN = 64


def footprint_mib(weights_mib: float) -> float:
    """A private MLP worker's measured footprint: about 1.8x the weights plus 6 MiB."""
    return 1.8 * weights_mib + 6


def build_models(
    repo: Path, sizes_mib: Sequence[float], x: np.ndarray, prefix: str = "m"
) -> tuple[list[str], dict[str, list[float]]]:
    """One MLP per size under ``repo/NAME/1``; returns the names and expected answers."""
    names: list[str] = []
    expected: dict[str, list[float]] = {}
    for i, mb in enumerate(sizes_mib):
        name = f"{prefix}{i:03d}"
        path = build_mlp_onnx(repo / name / "1" / "model.onnx", float(mb), seed=i)
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected[name] = sess.run(None, {"input": x})[0].ravel().tolist()
        names.append(name)
    return names, expected


def body_of(x: np.ndarray) -> dict[str, Any]:
    """The KServe v2 infer body for the input ``x``."""
    return {
        "inputs": [
            {"name": "input", "shape": [1, N_IN], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }


@dataclass
class Clients:
    """Sends a fixed request sequence with ``concurrency`` users and checks every answer.

    A unit of work is a list of model names sent one after the other by one user (one
    request, or a pipeline A -> B -> C); users take units from a shared iterator, so
    the sequence is the same in every run, interleaved by timing only.
    """

    client: httpx.AsyncClient
    body: dict[str, Any]
    expected: dict[str, list[float]]
    failures: list[str] = field(default_factory=list)
    answered: int = 0

    async def run(self, units: Sequence[Sequence[str]], concurrency: int) -> float:
        """Send every unit; returns the wall seconds."""
        work: Iterator[Sequence[str]] = iter(units)
        t0 = time.perf_counter()
        await asyncio.gather(*(self._user(work) for _ in range(concurrency)))
        return time.perf_counter() - t0

    async def _user(self, work: Iterator[Sequence[str]]) -> None:
        for unit in work:
            for name in unit:
                try:
                    r = await self.client.post(f"/v2/models/{name}/infer", json=self.body)
                except httpx.HTTPError as e:
                    self.failures.append(f"{name}: {type(e).__name__} {e}")
                    continue
                if r.status_code != 200:
                    self.failures.append(f"{name}: {r.status_code} {r.text[:200]}")
                    continue
                got = r.json()["outputs"][0]["data"]
                if not np.allclose(got, self.expected[name], rtol=1e-4, atol=1e-5):
                    self.failures.append(f"{name}: wrong answer")
                    continue
                self.answered += 1


def fork_server_of(root: psutil.Process) -> psutil.Process:
    """The fork server among ``root``'s children (the workers are its children)."""
    for child in root.children():
        with contextlib.suppress(psutil.Error):
            if "modelyard.workers.forkserver" in " ".join(child.cmdline()):
                return child
    raise RuntimeError("no fork server under this process")


@contextlib.asynccontextmanager
async def pss_sampler(period_s: float = 0.2) -> AsyncIterator[list[tuple[float, int]]]:
    """Sample the workers' summed PSS in a spawned process; the rows fill in on exit."""
    fork_server = fork_server_of(psutil.Process())
    spawn = multiprocessing.get_context("spawn")
    halt = spawn.Event()
    theirs, ours = spawn.Pipe(duplex=False)
    proc = spawn.Process(target=sample_loop, args=(fork_server.pid, period_s, halt, ours))
    proc.start()
    assert await asyncio.to_thread(theirs.recv) == "ready"
    rows: list[tuple[float, int]] = []
    try:
        yield rows
    finally:
        halt.set()
        rows.extend(await asyncio.to_thread(theirs.recv))
        await asyncio.to_thread(proc.join)


@contextlib.asynccontextmanager
async def budget_watch(budget: Any, period_s: float = 0.05) -> AsyncIterator[list[int]]:
    """Record every sampled moment the reservations exceed the budget."""
    violations: list[int] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            if budget.reserved_bytes > budget.budget_bytes:
                violations.append(budget.reserved_bytes)
            await asyncio.sleep(period_s)

    task = asyncio.create_task(watch())
    try:
        yield violations
    finally:
        stop.set()
        await task


def totals(stats: dict[str, Any]) -> dict[str, Any]:
    """Sums of the per-model counters of ``/v2/stats`` that the cache runs report."""
    models = stats["models"]
    keys = ("loads", "evictions", "cold_starts", "prefetches", "prefetch_hits")
    out: dict[str, Any] = {k: sum(int(m[k]) for m in models) for k in keys}
    out["prefetch_wasted"] = sum(int(m["prefetch_wasted"]) for m in models)
    out["cold_start_s"] = sum(float(m["cold_start_s_total"]) for m in models)
    out["hidden_s"] = sum(float(m["prefetch_hidden_s"]) for m in models)
    out["loads_by_model"] = {m["name"]: int(m["loads"]) for m in models}
    return out


def machine_load() -> str:
    """The 1-minute load average and the core count, for the record."""
    one, five, _ = psutil.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}) on {psutil.cpu_count()} cores"
