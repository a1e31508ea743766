"""The page-cache tier: loading a 200 MB ONNX model from a cold page cache vs a warmed one.

For each repeat, the model's files are dropped from the page cache
(``posix_fadvise(DONTNEED)``, as ``modelyard.repository.page_cache.drop`` does), then
either loaded at once (**cold**) or first warmed with ``page_cache.warm`` (``WILLNEED``,
what the manager does for a predicted model that does not fit) and loaded once the
readahead is done (**warmed**). The load is ONNX Runtime's session creation plus one
run, in this process (a worker's load without the process start). Order alternates
each repeat; medians.

    .venv/bin/python bench/bench_page_cache.py            # 200 MB, 7 repeats
    .venv/bin/python bench/bench_page_cache.py --read-mib-s 250   # on slower storage

``--read-mib-s N`` runs the repeats with this process's reads from the model's disk
throttled to N MiB/s by the kernel (a cgroup ``blkio.throttle.read_bps_device`` on
cgroup v1, ``io.max`` on v2; root only): the speed of a network block volume or a
spinning disk, where a model file is not a few hundred milliseconds from memory as on
this VM's host-cached disk. Both the load and the warming read through the same limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort

from modelyard.examples.mlp import build_mlp_onnx
from modelyard.repository import page_cache


@contextlib.contextmanager
def throttled_reads(path: Path, mib_s: float | None) -> Iterator[str]:
    """Within the block, this process reads ``path``'s disk at ``mib_s`` MiB/s at most."""
    if mib_s is None:
        yield "unthrottled"
        return
    st = os.stat(path)
    device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    bps = int(mib_s * 2**20)
    v1 = Path("/sys/fs/cgroup/blkio")
    if (v1 / "blkio.throttle.read_bps_device").exists():
        group, limit_file, limit = (
            v1 / f"bench-page-cache-{os.getpid()}",
            "blkio.throttle.read_bps_device",
            f"{device} {bps}",
        )
        root = v1
    else:
        root = Path("/sys/fs/cgroup")
        group, limit_file, limit = (
            root / f"bench-page-cache-{os.getpid()}",
            "io.max",
            f"{device} rbps={bps}",
        )
    group.mkdir()
    try:
        (group / limit_file).write_text(limit)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        try:
            yield f"reads throttled to {mib_s:g} MiB/s ({limit_file} of {device})"
        finally:
            (root / "cgroup.procs").write_text(str(os.getpid()))
    finally:
        group.rmdir()


def _load(path: Path) -> float:
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.zeros((1, 64), np.float32)
    sess.run(None, {"input": x})
    return time.perf_counter() - t0


def _cold(path: Path) -> tuple[float, float | None]:
    os.sync()
    page_cache.drop(path.parent)
    resident = page_cache.resident_fraction(path.parent)
    return _load(path), resident


def _warmed(path: Path) -> tuple[float, float | None, float]:
    os.sync()
    page_cache.drop(path.parent)
    t0 = time.perf_counter()
    page_cache.warm(path.parent)
    # WILLNEED returns at once; wait for the readahead as a prediction's lead time would.
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline:
        frac = page_cache.resident_fraction(path.parent)
        if frac is None or frac > 0.99:
            break
        time.sleep(0.01)
    warm_s = time.perf_counter() - t0
    return _load(path), page_cache.resident_fraction(path.parent), warm_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=Path("bench/results/page_cache.json"))
    parser.add_argument("--read-mib-s", type=float, default=None, help="throttle reads (root)")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-page-cache-") as d,
        throttled_reads(Path(d), args.read_mib_s) as storage,
    ):
        path = build_mlp_onnx(Path(d) / "m" / "1" / "model.onnx", args.mb)
        size = sum(p.stat().st_size for p in path.parent.iterdir())
        cold: list[float] = []
        warmed: list[float] = []
        warm_s: list[float] = []
        resident: dict[str, list[float | None]] = {"cold": [], "warmed": []}
        for i in range(args.repeats):
            order = ("cold", "warmed") if i % 2 == 0 else ("warmed", "cold")
            for kind in order:
                if kind == "cold":
                    t, frac = _cold(path)
                    cold.append(t)
                    resident["cold"].append(frac)
                else:
                    t, frac, w = _warmed(path)
                    warmed.append(t)
                    warm_s.append(w)
                    resident["warmed"].append(frac)
        c, w = statistics.median(cold), statistics.median(warmed)
        print(f"model {size / 2**20:.0f} MiB on disk, {storage}; {args.repeats} repeats, medians:")
        print("| page cache | load (ms) | resident before load | vs cold |")
        print("|---|---:|---:|---:|")
        print(f"| cold (DONTNEED) | {c * 1000:.1f} | {resident['cold'][0]} | 1.00 |")
        print(
            f"| warmed (WILLNEED, {statistics.median(warm_s) * 1000:.0f} ms ahead) "
            f"| {w * 1000:.1f} | {resident['warmed'][0]} | {w / c:.2f} |"
        )
        print(f"load time cut by {100 * (1 - w / c):.0f} %")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "storage": storage,
                    "size_bytes": size,
                    "cold_s": cold,
                    "warmed_s": warmed,
                    "warm_ahead_s": warm_s,
                    "resident": resident,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
