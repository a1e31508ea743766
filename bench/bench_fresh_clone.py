"""First run on a fresh clone: how long ``./scripts/serve-example.sh`` takes to serve, and
how big the environment it installs is, without and with the ``torch`` extra.

Run from the repository root with any Python 3.11+ (standard library only: nothing needs
to be installed first)::

    python3 bench/bench_fresh_clone.py                      # both variants, cold pip cache
    python3 bench/bench_fresh_clone.py --variants base      # only the default first run
    python3 bench/bench_fresh_clone.py --warm-cache         # reuse pip's own cache

Each variant gets its own ``git clone`` of this checkout's ``HEAD`` in a temporary
folder (the working tree's uncommitted changes are not in it), and its own empty pip
cache unless ``--warm-cache`` (a new user's first run downloads every wheel). The clock
starts when ``scripts/serve-example.sh`` is started and stops when ``/v2/health/ready``
answers 200 (set-up, example build and server start all included). Reported per variant:
that time, the size of ``.venv`` on disk, and whether the output held a deprecation
warning or a progress bar. ``torch`` (``EXTRAS=torch``) is the baseline: what the first
run installed before the default left the extra out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

TARGET_FIRST_SERVE_S = 60.0
"""Target: the default first run serves within this long."""
TARGET_VENV_MB = 600.0
"""Target: the default first run installs at most this much."""

_VARIANTS = {"base": "", "torch": "torch"}
"""Variant name → the ``EXTRAS`` it installs."""

_NOISE = {
    "deprecation": re.compile(r"deprecat", re.IGNORECASE),
    # tqdm's and pip's bars: block characters or "|####   |" with a percentage.
    "progress_bar": re.compile(r"[━█▏▎▍▌▋▊▉]|\d+%\|"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _size_mb(folder: Path) -> float:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total / 2**20


def _children_cpu_s() -> float:
    # User + system time of the waited-for descendants: set-up, example build and the
    # server (its worker processes count when the server reaps them).
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # The server and its workers share the session serve-example.sh started.
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_variant(
    source: Path,
    name: str,
    extras: str,
    *,
    warm_cache: bool,
    timeout_s: float,
    ref: str | None = None,
) -> dict[str, Any]:
    """Clone ``source`` (at ``ref``, default its HEAD) and time its first
    ``serve-example.sh`` with ``extras``."""
    with tempfile.TemporaryDirectory(prefix=f"modelyard-first-{name}-") as tmp:
        clone = Path(tmp) / "modelyard"
        subprocess.run(
            ["git", "clone", "-q", str(source), str(clone)], check=True, capture_output=True
        )
        if ref is not None:
            subprocess.run(
                ["git", "-C", str(clone), "checkout", "-q", ref], check=True, capture_output=True
            )
        env = {**os.environ, "EXTRAS": extras, "PYTHONUNBUFFERED": "1"}
        for var in ("VENV", "VIRTUAL_ENV", "PYTHONPATH", "SKIP_INSTALL", "EXAMPLE_DIR"):
            env.pop(var, None)
        if not warm_cache:
            env["PIP_CACHE_DIR"] = str(Path(tmp) / "pip-cache")
        port = _free_port()
        log = Path(tmp) / "serve.log"
        url = f"http://127.0.0.1:{port}"
        load_before = os.getloadavg()[0]
        cpu_before = _children_cpu_s()
        start = time.perf_counter()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["./scripts/serve-example.sh", "--http-port", str(port), "--grpc-port", "0"],
                cwd=clone,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                while not _ready(url):
                    if proc.poll() is not None:
                        raise RuntimeError(f"{name}: exited {proc.returncode}:\n{log.read_text()}")
                    if time.perf_counter() - start > timeout_s:
                        raise RuntimeError(f"{name}: not ready in {timeout_s:g} s")
                    time.sleep(0.2)
                first_serve_s = time.perf_counter() - start
            finally:
                _stop(proc)
        cpu_s = _children_cpu_s() - cpu_before
        text = log.read_text(errors="replace")
        result: dict[str, Any] = {
            "variant": name,
            "extras": extras,
            "first_serve_s": round(first_serve_s, 1),
            "cpu_s": round(cpu_s, 1),
            "load_avg": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            "venv_mb": round(_size_mb(clone / ".venv"), 0),
            "pip_cache_mb": None if warm_cache else round(_size_mb(Path(tmp) / "pip-cache"), 0),
        }
        for key, pattern in _NOISE.items():
            hits = [line for line in text.splitlines() if pattern.search(line)]
            result[key] = hits[:3]
        shutil.rmtree(clone / ".venv", ignore_errors=True)
        return result


def main() -> int:
    """Run the variants and print a table (and JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="base,torch", help="comma-separated: base,torch")
    parser.add_argument("--warm-cache", action="store_true", help="use pip's own cache")
    parser.add_argument("--timeout", type=float, default=900, help="per variant, seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--before",
        metavar="REF",
        help="also run the commit REF's own serve-example.sh as variant 'before'",
    )
    args = parser.parse_args()
    source = Path(__file__).resolve().parent.parent
    results = [
        run_variant(source, v, _VARIANTS[v], warm_cache=args.warm_cache, timeout_s=args.timeout)
        for v in args.variants.split(",")
    ]
    if args.before:
        results.append(
            run_variant(
                source,
                "before",
                "",
                warm_cache=args.warm_cache,
                timeout_s=args.timeout,
                ref=args.before,
            )
        )
    print(
        f"{'variant':8} {'first serve s':>14} {'CPU s':>7} {'.venv MB':>9} "
        f"{'pip cache MB':>13} {'load avg':>11}  noise"
    )
    for r in results:
        noise = ", ".join(k for k in _NOISE if r[k]) or "none"
        load = "{:.1f}-{:.1f}".format(*r["load_avg"])
        print(
            f"{r['variant']:8} {r['first_serve_s']:14.1f} {r['cpu_s']:7.1f} {r['venv_mb']:9.0f} "
            f"{r['pip_cache_mb'] or 0:13.0f} {load:>11}  {noise}"
        )
    by_name = {r["variant"]: r for r in results}
    if "base" in by_name and "torch" in by_name:
        base, torch = by_name["base"], by_name["torch"]
        print(
            f"base / torch: time {base['first_serve_s'] / torch['first_serve_s']:.2f}, "
            f"size {base['venv_mb'] / torch['venv_mb']:.2f}"
        )
    if "base" in by_name:
        base = by_name["base"]
        ok = base["first_serve_s"] <= TARGET_FIRST_SERVE_S and base["venv_mb"] <= TARGET_VENV_MB
        print(
            f"targets (base: <= {TARGET_FIRST_SERVE_S:g} s, <= {TARGET_VENV_MB:g} MB): "
            f"{'met' if ok else 'MISSED'}"
        )
    for r in results:
        for key in _NOISE:
            for line in r[key]:
                print(f"{r['variant']} {key}: {line}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
