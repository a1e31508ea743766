"""Where a ``modelyard serve`` process spends its time under one benchmark's load (py-spy).

Run from the repository root (needs ``.venv/bin/pip install py-spy`` and ptrace rights)::

    .venv/bin/python bench/profile_server.py rest-inline      # identity, REST, concurrency 1
    .venv/bin/python bench/profile_server.py rest-process
    .venv/bin/python bench/profile_server.py grpc-process     # identity, gRPC, concurrency 32
    .venv/bin/python bench/profile_server.py load-1mb         # load/unload loop, 1 MB MLP
    .venv/bin/python bench/profile_server.py load-50mb        # load/unload loop, 50 MB MLP

It starts the server as the benchmarks do, runs the load for ``--duration-s`` while
``py-spy record --format raw --subprocesses`` samples the server and its workers (by
default only the thread holding the GIL, i.e. where Python CPU time goes), then prints, for
the server and the workers apart: self time by package of the leaf frame, and the
functions with the most samples, *self* (leaf frame) and *inclusive* (anywhere on the
stack). The raw stacks are written to ``bench/results/profile-<scenario>.txt`` for
flame-graph tools (``flamegraph.pl``, speedscope). Sampling slows the server a little:
read shares, not absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _server

from modelyard.bench import BenchConfig, run_bench
from modelyard.examples.mlp import build_identity_onnx, build_mlp_onnx

SCENARIOS = ("rest-inline", "rest-process", "grpc-process", "load-1mb", "load-50mb")
_PROCESS_FRAME = re.compile(r"^process \d+:")
_FILE = re.compile(r"\(([^:()]+)(?::\d+)?\)$")

PACKAGES = (
    ("uvicorn/", "uvicorn"),
    ("starlette/", "starlette"),
    ("grpc/", "grpc"),
    ("google/protobuf", "protobuf"),
    ("modelyard/frontends/", "modelyard.frontends"),
    ("modelyard/protocol/", "modelyard.protocol"),
    ("modelyard/scheduling/", "modelyard.scheduling"),
    ("modelyard/workers/", "modelyard.workers"),
    ("modelyard/manager/", "modelyard.manager"),
    ("modelyard/runtimes/", "modelyard.runtimes"),
    ("modelyard/observability/", "modelyard.observability"),
    ("modelyard/", "modelyard (other)"),
    ("prometheus_client/", "prometheus_client"),
    ("onnxruntime/", "onnxruntime"),
    ("numpy/", "numpy"),
    ("asyncio/", "asyncio"),
    ("concurrent/futures/", "concurrent.futures"),
    ("threading.py", "threading"),
)
"""Self time is grouped by the package of the leaf frame's file, first match wins."""


def package_of(frame: str) -> str:
    """The :data:`PACKAGES` group of a py-spy frame ``function (path:line)``."""
    match = _FILE.search(frame)
    path = match.group(1) if match else frame
    for fragment, group in PACKAGES:
        if fragment in path:
            return group
    if path.startswith("<") or path.endswith(".py"):
        return "python stdlib / other"
    return "native: " + path.rsplit("/", 1)[-1]


def _py_spy() -> str:
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def _drive_load(server: _server.Server, scenario: str, duration_s: float) -> int:
    if scenario.startswith("load-"):
        name = f"mlp-{scenario.removeprefix('load-')}"
        cycles = 0
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline and cycles < 1000:
            server.post(f"/v2/repository/models/{name}/load")
            server.post(f"/v2/repository/models/{name}/unload")
            cycles += 1
        return cycles
    grpc = scenario.startswith("grpc")
    config = BenchConfig(
        url=server.url,
        grpc_target=server.grpc_target if grpc else None,
        models=(f"identity-{scenario.split('-')[1]}",),
        concurrency=(32 if grpc else 1,),
        duration_s=duration_s,
        warmup_s=0.0,
    )
    return asyncio.run(run_bench(config))[0].requests


def summarise(raw: Path, top: int) -> str:
    """Self and inclusive sample counts per function, grouped by process."""
    self_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    incl_counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    packages: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        # Drop the process and thread frames py-spy adds at the root.
        frames = [
            f
            for f in stack.split(";")
            if not _PROCESS_FRAME.match(f) and not f.startswith("thread ")
        ]
        if not frames:
            continue
        # NOTE: py-spy may label a fork server's children with the server's pid, so tell
        # worker stacks apart by their frames.
        is_worker = any("workers/forkserver.py" in f or "workers/main.py" in f for f in frames)
        key = "worker processes" if is_worker else "server process"
        totals[key] += count
        self_counts[key][frames[-1]] += count
        packages[key][package_of(frames[-1])] += count
        for frame in set(frames):
            incl_counts[key][frame] += count
    out = []
    for key, total in totals.most_common():
        out.append(f"\n## {key}: {total} samples\n")
        out.append("self% by package of the leaf frame")
        for group, n in packages[key].most_common():
            out.append(f"{100 * n / total:5.1f}  {group}")
        out.append("")
        out.append("self%   function")
        for frame, n in self_counts[key].most_common(top):
            out.append(f"{100 * n / total:5.1f}  {frame}")
        out.append("\nincl%   function")
        for frame, n in incl_counts[key].most_common(top):
            out.append(f"{100 * n / total:5.1f}  {frame}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--duration-s", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=25, help="functions listed per view")
    parser.add_argument("--native", action="store_true", help="include native frames")
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="sample every non-idle thread, not only the one holding the GIL",
    )
    args = parser.parse_args()
    py_spy = _py_spy()
    out = _server.RESULTS_DIR / f"profile-{args.scenario}.txt"
    _server.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        root = Path(tmp)
        build_identity_onnx(root / "identity" / "1" / "model.onnx")
        entries: list[dict[str, object]] = [
            {"name": f"identity-{iso}", "path": "identity", "isolation": iso, "preload": True}
            for iso in ("inline", "process")
        ]
        if args.scenario.startswith("load-"):
            size = float(args.scenario.removeprefix("load-").removesuffix("mb"))
            name = f"mlp-{args.scenario.removeprefix('load-')}"
            build_mlp_onnx(root / name / "1" / "model.onnx", size)
            entries.append({"name": name, "path": name, "isolation": "process"})
        cfg = _server.write_config(root, entries)
        grpc = args.scenario.startswith("grpc")
        with _server.Server(cfg, root / "server.log", grpc=grpc) as server:
            command = [
                py_spy,
                "record",
                "--pid",
                str(server.pid),
                "--format",
                "raw",
                "--rate",
                str(args.rate),
                "--duration",
                str(int(args.duration_s + 1)),
                "--output",
                str(out),
                "--subprocesses",
            ]
            if args.native:
                command.append("--native")
            if not args.all_threads:
                # NOTE: without --gil, thread-pool threads parked on their queue are often
                # counted as busy; the GIL holder is where the Python CPU time goes.
                command.append("--gil")
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(0.5)  # let py-spy attach before the load starts
            done: list[int] = []
            driver = threading.Thread(
                target=lambda: done.append(_drive_load(server, args.scenario, args.duration_s))
            )
            driver.start()
            driver.join()
            _, err = spy.communicate(timeout=60)
            if spy.returncode != 0:
                print(err.decode(errors="replace"), file=sys.stderr)
    print(
        f"{args.scenario}: {done[0] if done else 0} requests or load cycles in "
        f"{args.duration_s:g} s; raw stacks in {out.relative_to(_server.REPO_ROOT)}"
    )
    print(summarise(out, args.top))


if __name__ == "__main__":
    main()
