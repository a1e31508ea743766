"""Soak: minutes of mixed traffic, reporting leaks and every request's outcome.

A real ``modelyard serve`` process with 20 ONNX MLPs (some with ``share_weights``) under a
budget of about 40 % of their footprints, so loads evict. Concurrent users send:

* inferences, model chosen by Zipf 1.1 popularity, answers checked against ONNX Runtime;
* bad requests (wrong shape, wrong datatype, malformed JSON, no inputs, unknown model or
  version), each with the 4xx it must get;
* explicit loads and unloads through the repository API;

and every ``--kill-every-s`` seconds one READY worker (its pid read from
``/v2/health/details``) is SIGKILLed. Each second the server tree is sampled: RSS (server
process, fork server, whole tree), open descriptors, memfds held (``/proc/<pid>/fd`` links
to ``memfd:``), ``/dev/shm`` files mapped or held, and threads.

Statuses a worker kill may legitimately produce: **503** for an inference on the killed
model sent within ``KILL_WINDOW_S`` after the kill (``WorkerCrashedError`` for the calls in
flight, ``ModelNotReadyError`` or ``CircuitOpenError`` while the replacement starts), that
is, a kill of that model between ``KILL_WINDOW_S`` before the request was sent and its
answer (a request queued behind a slow load can be in flight for seconds). Any
other 5xx, a transport error or a timeout is a failure. Explicit unloads may get 409
(the model is loading) and explicit loads 503 (budget full of models that are loading).

At the end every model is unloaded, clients are closed and the server is left to settle;
descriptors, memfds and ``/dev/shm`` files must then equal the baseline taken after
warm-up with every model unloaded the same way. Server RSS growth after warm-up is the
last quarter's median over the median of the first sample after warm-up.

    .venv/bin/python bench/soak.py                  # 30 minutes
    .venv/bin/python bench/soak.py --duration-s 60  # what CI runs (tests/integration/test_soak.py)

Writes ``bench/results/soak.json`` and ``soak.png`` (or ``--out``/``--plot``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _server
import httpx
import numpy as np
import onnxruntime as ort
import psutil

from modelyard.examples.mlp import MIB, build_mlp_onnx

N_MODELS = 20
KILL_WINDOW_S = 15.0
"""A 503 on a killed model's inference sent within this long after the kill is expected."""
SETTLE_S = 3.0
SAMPLE_EVERY_S = 1.0
REQUEST_TIMEOUT_S = 120.0
"""A request unanswered after this long counts as a hang."""

# Fractions of each user's operations (the rest are good inferences).
BAD_FRACTION = 0.06
LOAD_FRACTION = 0.02
UNLOAD_FRACTION = 0.02


@dataclass
class Sample:
    """One reading of the server tree."""

    t: float
    server_rss: int
    fork_server_rss: int
    tree_rss: int
    tree_pss: int
    server_fds: int
    tree_fds: int
    memfds: int
    shm_files: int
    dev_shm_entries: int
    server_threads: int
    tree_threads: int
    workers: int
    fd_kinds: dict[str, int] = field(default_factory=dict)
    """Descriptors by process role and kind (``worker:socket``): says what differs."""


@dataclass
class Outcomes:
    """Every request's outcome, by operation and status."""

    sent: int = 0
    answered: int = 0
    by_op: dict[str, Counter[str]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    wrong_answers: int = 0

    def note(self, op: str, status: str, ok: bool, detail: str = "") -> None:
        self.by_op.setdefault(op, Counter())[status] += 1
        if not ok and len(self.unexpected) < 200:
            self.unexpected.append(f"{op} {status} {detail[:200]}")


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _fd_targets(pid: int) -> list[str]:
    out = []
    fd_dir = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                out.append(os.readlink(fd))
    return out


def _fd_kind(target: str) -> str:
    """``socket:[123]`` -> ``socket``; ``/memfd:x (deleted)`` -> ``memfd``; paths stay."""
    if target.startswith("/memfd:"):
        return "memfd"
    if target.endswith("]") and ":[" in target:
        return target.split(":[", 1)[0]
    return target


def _shm_mapped(pid: int) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                found.add(parts[5])
    return found


def sample(server_pid: int, t0: float) -> Sample:
    """Read the server tree's memory, descriptors, shared memory and threads."""
    procs = _tree(server_pid)
    server_rss = fork_rss = tree_rss = tree_pss = 0
    server_fds = tree_fds = memfds = server_threads = tree_threads = workers = 0
    shm: set[str] = set()
    kinds: Counter[str] = Counter()
    for proc in procs:
        try:
            info = proc.memory_full_info()
            threads = proc.num_threads()
            cmdline = " ".join(proc.cmdline())
            parent = proc.ppid()
        except psutil.Error:
            continue
        targets = _fd_targets(proc.pid)
        tree_rss += info.rss
        tree_pss += getattr(info, "pss", info.uss)
        tree_fds += len(targets)
        memfds += sum(1 for t in targets if t.startswith("/memfd:"))
        shm |= {t for t in targets if t.startswith("/dev/shm/")} | _shm_mapped(proc.pid)
        tree_threads += threads
        if proc.pid == server_pid:
            server_rss, server_fds, server_threads = info.rss, len(targets), threads
            role = "server"
        elif parent == server_pid and "forkserver" in cmdline:
            fork_rss = info.rss
            role = "forkserver"
        else:
            workers += 1  # forked from the fork server: same command line, other parent
            role = "worker"
        kinds.update(f"{role}:{_fd_kind(t)}" for t in targets)
    try:
        dev_shm = len(os.listdir("/dev/shm"))
    except OSError:
        dev_shm = -1
    return Sample(
        t=time.monotonic() - t0,
        server_rss=server_rss,
        fork_server_rss=fork_rss,
        tree_rss=tree_rss,
        tree_pss=tree_pss,
        server_fds=server_fds,
        tree_fds=tree_fds,
        memfds=memfds,
        shm_files=len(shm),
        dev_shm_entries=dev_shm,
        server_threads=server_threads,
        tree_threads=tree_threads,
        workers=workers,
        fd_kinds=dict(sorted(kinds.items())),
    )


def _settled(s: Sample) -> tuple[int, ...]:
    """What must hold still for a sample to be a baseline."""
    return (s.workers, s.tree_fds, s.server_fds, s.memfds, s.shm_files)


def build_models(repo: Path, seed: int = 0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """20 MLPs of 1-6 MiB of weights; every fourth maps its weights (``share_weights``)."""
    rng = np.random.default_rng(seed)
    x = rng.random((1, 64), dtype=np.float32)
    sizes = np.linspace(1, 6, N_MODELS)
    models: list[dict[str, Any]] = []
    expected: dict[str, list[float]] = {}
    for i, mb in enumerate(sizes):
        name = f"s{i:02d}"
        shared = i % 4 == 3
        path = build_mlp_onnx(
            repo / name / "1" / "model.onnx", float(mb), seed=i, external_data=shared
        )
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        expected[name] = sess.run(None, {"input": x})[0].ravel().tolist()
        entry: dict[str, Any] = {"name": name, "path": name}
        if shared:
            entry["share_weights"] = True
        models.append(entry)
    body = {
        "inputs": [
            {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    footprint_mb = float(sum(1.8 * mb + 6 for mb in sizes))
    return models, {"expected": expected, "body": body, "footprint_mb": footprint_mb}


def _bad_requests(names: list[str], body: dict[str, Any]) -> list[tuple[str, str, Any, int]]:
    """(label, path, json body or raw bytes, the status it must get)."""
    good = body["inputs"][0]
    name = names[0]
    infer = f"/v2/models/{name}/infer"
    return [
        ("wrong_shape", infer, {"inputs": [{**good, "shape": [1, 63]}]}, 400),
        ("wrong_datatype", infer, {"inputs": [{**good, "datatype": "INT8"}]}, 400),
        ("no_inputs", infer, {"inputs": []}, 400),
        ("malformed_json", infer, b'{"inputs": [', 400),
        ("unknown_model", "/v2/models/no-such-model/infer", body, 404),
        ("unknown_version", f"/v2/models/{name}/versions/9/infer", body, 404),
    ]


class Soak:
    """The traffic, the killer and the sampler against one server."""

    def __init__(
        self,
        server: _server.Server,
        models: list[dict[str, Any]],
        data: dict[str, Any],
        *,
        duration_s: float,
        concurrency: int,
        kill_every_s: float,
        seed: int,
    ) -> None:
        self.server = server
        self.names = [m["name"] for m in models]
        self.expected: dict[str, list[float]] = data["expected"]
        self.body: dict[str, Any] = data["body"]
        self.duration_s = duration_s
        self.concurrency = concurrency
        self.kill_every_s = kill_every_s
        self.seed = seed
        self.outcomes = Outcomes()
        self.samples: list[Sample] = []
        self.kills: list[tuple[float, str, int]] = []
        self.kill_times: dict[str, list[float]] = {}
        self.bad = _bad_requests(self.names, self.body)
        self.t0 = time.monotonic()
        self._stop = asyncio.Event()

    async def _send(
        self, client: httpx.AsyncClient, op: str, method: str, path: str, body: Any = None
    ) -> httpx.Response | None:
        self.outcomes.sent += 1
        try:
            if isinstance(body, bytes):
                r = await client.request(
                    method, path, content=body, headers={"content-type": "application/json"}
                )
            else:
                r = await client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            self.outcomes.note(op, type(exc).__name__, False, f"{path}: {exc!r}")
            return None
        self.outcomes.answered += 1
        return r

    def _killed_during(self, name: str, sent_at: float, answered_at: float) -> bool:
        # A kill while the request was in flight, or shortly before it was sent.
        return any(
            sent_at - KILL_WINDOW_S <= killed <= answered_at
            for killed in self.kill_times.get(name, ())
        )

    async def user(self, client: httpx.AsyncClient, index: int) -> None:
        pick = random.Random(self.seed * 1000 + index)
        weights = [1.0 / (i + 1) ** 1.1 for i in range(len(self.names))]
        while not self._stop.is_set():
            roll = pick.random()
            name = pick.choices(self.names, weights)[0]
            if roll < BAD_FRACTION:
                label, path, body, want = pick.choice(self.bad)
                r = await self._send(client, f"bad:{label}", "POST", path, body)
                if r is not None:
                    self.outcomes.note(
                        f"bad:{label}", str(r.status_code), r.status_code == want, r.text
                    )
            elif roll < BAD_FRACTION + LOAD_FRACTION:
                r = await self._send(
                    client, "load", "POST", f"/v2/repository/models/{name}/load", {}
                )
                if r is not None:
                    self.outcomes.note(
                        "load", str(r.status_code), r.status_code in (200, 503), r.text
                    )
            elif roll < BAD_FRACTION + LOAD_FRACTION + UNLOAD_FRACTION:
                r = await self._send(
                    client, "unload", "POST", f"/v2/repository/models/{name}/unload", {}
                )
                if r is not None:
                    self.outcomes.note(
                        "unload", str(r.status_code), r.status_code in (200, 409), r.text
                    )
            else:
                sent_at = time.monotonic()
                r = await self._send(client, "infer", "POST", f"/v2/models/{name}/infer", self.body)
                if r is None:
                    continue
                if r.status_code == 200:
                    got = r.json()["outputs"][0]["data"]
                    if not np.allclose(got, self.expected[name], rtol=1e-4, atol=1e-5):
                        self.outcomes.wrong_answers += 1
                        self.outcomes.note("infer", "wrong_answer", False, name)
                    else:
                        self.outcomes.note("infer", "200", True)
                elif r.status_code == 503 and self._killed_during(name, sent_at, time.monotonic()):
                    self.outcomes.note("infer", "503_after_kill", True)
                else:
                    self.outcomes.note("infer", str(r.status_code), False, f"{name}: {r.text}")

    async def killer(self, client: httpx.AsyncClient) -> None:
        pick = random.Random(self.seed)
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.kill_every_s)
            if self._stop.is_set():
                return
            try:
                details = (await client.get("/v2/health/details")).json()
            except httpx.HTTPError:
                continue
            ready = [m for m in details["models"] if m.get("pid")]
            if not ready:
                continue
            victim = pick.choice(ready)
            self.kill_times.setdefault(victim["name"], []).append(time.monotonic())
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(victim["pid"]), signal.SIGKILL)
                self.kills.append((time.monotonic() - self.t0, victim["name"], int(victim["pid"])))

    async def sampler(self) -> None:
        while not self._stop.is_set():
            self.samples.append(await asyncio.to_thread(sample, self.server.pid, self.t0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), SAMPLE_EVERY_S)

    async def unload_all(self) -> None:
        """Unload every model (retrying 409s while loads finish), then close the client."""
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=self.server.url, timeout=REQUEST_TIMEOUT_S, limits=limits
        ) as client:
            for _ in range(50):
                busy = False
                for name in self.names:
                    r = await client.post(f"/v2/repository/models/{name}/unload", json={})
                    busy |= r.status_code == 409
                details = (await client.get("/v2/health/details")).json()
                if not busy and all(
                    m["state"] in ("UNLOADED", "FAILED") for m in details["models"]
                ):
                    return
                await asyncio.sleep(0.5)

    async def baseline(self) -> Sample:
        """Unload everything, let the server settle, sample it."""
        await self.unload_all()
        await asyncio.sleep(SETTLE_S)
        # The spare worker forked after the last claim may still be starting (its
        # descriptors come and go): sample until the tree holds still, two samples alike.
        last = await asyncio.to_thread(sample, self.server.pid, self.t0)
        for _ in range(20):
            await asyncio.sleep(0.5)
            now = await asyncio.to_thread(sample, self.server.pid, self.t0)
            if _settled(last) == _settled(now):
                return now
            last = now
        return last

    async def run(self) -> dict[str, Any]:
        start = await asyncio.to_thread(sample, self.server.pid, self.t0)
        limits = httpx.Limits(max_connections=self.concurrency + 2)
        warmup_s = min(120.0, max(10.0, self.duration_s * 0.1))
        async with httpx.AsyncClient(
            base_url=self.server.url, timeout=REQUEST_TIMEOUT_S, limits=limits
        ) as client:
            # Warm-up: every model loaded and asked once, so lazily created pools and
            # caches exist before the baseline is taken.
            for name in self.names:
                await self._send(client, "warmup", "POST", f"/v2/models/{name}/infer", self.body)
        after_warmup = await self.baseline()
        self.t0 = time.monotonic()
        async with httpx.AsyncClient(
            base_url=self.server.url, timeout=REQUEST_TIMEOUT_S, limits=limits
        ) as client:
            tasks = [asyncio.create_task(self.user(client, i)) for i in range(self.concurrency)]
            tasks += [asyncio.create_task(self.killer(client)), asyncio.create_task(self.sampler())]
            await asyncio.sleep(self.duration_s)
            self._stop.set()
            await asyncio.gather(*tasks)
        end = await self.baseline()
        return self.report(start, after_warmup, end, warmup_s)

    def report(self, start: Sample, base: Sample, end: Sample, warmup_s: float) -> dict[str, Any]:
        after = [s for s in self.samples if s.t >= warmup_s]
        first = after[: max(1, len(after) // 10)]
        last = after[-max(1, len(after) // 4) :]
        growth = 0.0
        if first and last:
            core_first = statistics.median(s.server_rss + s.fork_server_rss for s in first)
            core_last = statistics.median(s.server_rss + s.fork_server_rss for s in last)
            growth = (core_last - core_first) / core_first
        return {
            "duration_s": self.duration_s,
            "concurrency": self.concurrency,
            "warmup_s": warmup_s,
            "sent": self.outcomes.sent,
            "answered": self.outcomes.answered,
            "wrong_answers": self.outcomes.wrong_answers,
            "outcomes": {op: dict(c) for op, c in sorted(self.outcomes.by_op.items())},
            "unexpected": self.outcomes.unexpected,
            "kills": len(self.kills),
            "core_rss_growth_after_warmup": growth,
            "start": start.__dict__,
            "baseline": base.__dict__,
            "end": end.__dict__,
            "samples": [s.__dict__ for s in self.samples],
        }


def plot(result: dict[str, Any], path: Path) -> None:
    """RSS, descriptors, shared memory and threads over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    mib = float(MIB)
    axes[0].plot(t, [s["server_rss"] / mib for s in samples], label="server RSS")
    axes[0].plot(t, [s["fork_server_rss"] / mib for s in samples], label="fork server RSS")
    axes[0].plot(t, [s["tree_pss"] / mib for s in samples], label="tree PSS")
    axes[0].set_ylabel("MiB")
    axes[1].plot(t, [s["server_fds"] for s in samples], label="server fds")
    axes[1].plot(t, [s["tree_fds"] for s in samples], label="tree fds")
    axes[2].plot(t, [s["memfds"] for s in samples], label="memfds held (tree)")
    axes[2].plot(t, [s["shm_files"] for s in samples], label="/dev/shm files held (tree)")
    axes[2].plot(t, [s["workers"] for s in samples], label="workers")
    axes[3].plot(t, [s["server_threads"] for s in samples], label="server threads")
    axes[3].plot(t, [s["tree_threads"] for s in samples], label="tree threads")
    for kill_t, _, _ in result.get("kill_times", []):
        for ax in axes:
            ax.axvline(kill_t / 60, color="red", alpha=0.15, linewidth=0.8)
    for ax in axes:
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes (red: worker SIGKILLed)")
    fig.suptitle(
        f"modelyard soak: {result['duration_s'] / 60:.1f} min, {result['sent']} requests, "
        f"{result['kills']} kills"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kill-every-s", type=float, default=20.0)
    parser.add_argument("--budget-fraction", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=_server.RESULTS_DIR / "soak.json")
    parser.add_argument("--plot", type=Path, default=_server.RESULTS_DIR / "soak.png")
    args = parser.parse_args()
    _server.install_uvloop()
    with tempfile.TemporaryDirectory(prefix="modelyard-soak-") as tmp:
        root = Path(tmp)
        models, data = build_models(root, args.seed)
        budget_mb = round(data["footprint_mb"] * args.budget_fraction)
        config = _server.write_config(root, models, budget_mb=budget_mb)
        with _server.Server(config, root / "server.log") as server:
            # The readiness client's keep-alive connection would count as a descriptor.
            server.client.close()
            soak = Soak(
                server,
                models,
                data,
                duration_s=args.duration_s,
                concurrency=args.concurrency,
                kill_every_s=args.kill_every_s,
                seed=args.seed,
            )
            result = asyncio.run(soak.run())
            result["kill_times"] = soak.kills
            result["budget_mb"] = budget_mb
            result["footprint_mb"] = data["footprint_mb"]
            result["server_log_tail"] = server.log_tail(40)
    result["environment"] = _server.environment()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    plot(result, args.plot)
    base, end = result["baseline"], result["end"]
    print(
        f"{result['duration_s']:.0f} s: sent {result['sent']}, answered {result['answered']}, "
        f"kills {result['kills']}, wrong answers {result['wrong_answers']}\n"
        f"outcomes: {json.dumps(result['outcomes'])}\n"
        f"unexpected: {len(result['unexpected'])} {result['unexpected'][:5]}\n"
        f"server+fork-server RSS growth after warm-up: "
        f"{result['core_rss_growth_after_warmup'] * 100:.2f} %\n"
        f"baseline → end: tree fds {base['tree_fds']} → {end['tree_fds']}, memfds "
        f"{base['memfds']} → {end['memfds']}, shm {base['shm_files']} → {end['shm_files']}, "
        f"server threads {base['server_threads']} → {end['server_threads']}, workers "
        f"{base['workers']} → {end['workers']}\n"
        f"results: {args.out}, plot: {args.plot}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
