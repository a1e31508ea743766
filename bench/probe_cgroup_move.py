"""What a worker's memory limit costs at load time: the cgroup steps, one by one.

Run from the repository root::

    .venv/bin/python bench/probe_cgroup_move.py

With a cgroup backend, every worker start after a model's first load calls the limiter's
``apply(pid, limit)``: make a group, write its limit, write the pid to ``cgroup.procs``.
This probe does the same to short-lived ``sleep`` processes with the server's own limiter
(``WorkerFactory().limiter``), ``--spacing-ms`` apart (loads are tens of ms apart; the
kernel's cost of moving a task between cgroups depends on how recently it last did so),
and times each step. With the ``rlimit`` backend it only times ``apply``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from typing import Any

import _server

from modelyard.workers.factory import WorkerFactory

_LIMIT_BYTES = 512 * 1024 * 1024


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples):.2f} (max {max(samples):.2f})"


async def _limiter_run(args: argparse.Namespace) -> tuple[str, dict[str, list[float]]]:
    async with WorkerFactory() as factory:
        return factory.limiter.name, measure(factory.limiter, args)


def measure(limiter: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    """Milliseconds per step and repeat."""
    steps: dict[str, list[float]] = {}
    base = getattr(limiter, "base", None)
    for spacing_s in (0.0, args.spacing_ms / 1000):
        label = "apply, back to back" if spacing_s == 0 else f"apply, {args.spacing_ms:g} ms apart"
        steps[label] = []
        for _ in range(args.repeats):
            proc = subprocess.Popen(["sleep", "5"])
            time.sleep(spacing_s)
            t0 = time.perf_counter()
            limit = limiter.apply(proc.pid, _LIMIT_BYTES)
            steps[label].append((time.perf_counter() - t0) * 1e3)
            proc.kill()
            proc.wait()
            limit.release()
    if base is not None:
        # The same three writes by hand, to see which one is slow.
        limit_file = "memory.max" if limiter.name == "cgroup2" else "memory.limit_in_bytes"
        parts: dict[str, list[float]] = {"mkdir": [], limit_file: [], "cgroup.procs": []}
        for i in range(args.repeats):
            proc = subprocess.Popen(["sleep", "5"])
            time.sleep(args.spacing_ms / 1000)
            group = base / f"modelyard-probe-{proc.pid}-{i}"
            t0 = time.perf_counter()
            group.mkdir()
            t1 = time.perf_counter()
            (group / limit_file).write_text(str(_LIMIT_BYTES))
            t2 = time.perf_counter()
            (group / "cgroup.procs").write_text(str(proc.pid))
            t3 = time.perf_counter()
            proc.kill()
            proc.wait()
            for _ in range(100):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.005)
            for key, value in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                parts[key].append(value * 1e3)
        for key, values in parts.items():
            steps[f"by hand, {args.spacing_ms:g} ms apart: {key}"] = values
    return steps


def main(args: argparse.Namespace) -> None:
    backend, steps = asyncio.run(_limiter_run(args))
    print(f"\nbackend: {backend}; {args.repeats} repeats; medians (ms)\n")
    print(_server.markdown_table(["step", "ms"], [[k, _ms(v)] for k, v in steps.items()]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--spacing-ms", type=float, default=50.0)
    main(parser.parse_args())
