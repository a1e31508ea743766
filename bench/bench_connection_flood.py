"""A connection flood against the REST port: do good clients still get answers?

Run from the repository root::

    .venv/bin/python bench/bench_connection_flood.py
    .venv/bin/python bench/bench_connection_flood.py --attackers 1100 --nofile 1024

The server runs in this process with its file limit (soft and hard) lowered to
``--nofile``, as on a host whose limit is the common 1,024 and cannot be raised. An
attacker process (started first, so its own limit is not lowered) opens ``--attackers``
connections to the HTTP port and says nothing on them (or, with ``--slow``, sends a
request head one byte at a time). Meanwhile, ``--good`` fresh clients each send one
inference request from this process (so they need descriptors of the same table);
the script reports how many got a 200, their latencies, and how many connections the
server held. Run it against a checkout without ``limits:``
(before issue 12) to see the failure it fixes: accept() fails with EMFILE and every
good request fails.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpcore  # noqa: F401  # imported before the limit is lowered
import httpx
import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.examples.mlp import build_add_onnx

BODY = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 0]}]}

ATTACKER = """
import resource, socket, sys, time
count, slow, hold_s = int(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
port = int(sys.stdin.readline())
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
socks = []
for _ in range(count):
    try:
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        break
print(len(socks), flush=True)
head = b"POST /v2/models/add/infer HTTP/1.1\\r\\nHost: x\\r\\nX-Pad: "
end = time.monotonic() + hold_s
i = 0
while time.monotonic() < end:
    if slow:
        for s in socks:
            try:
                s.send(head[i % len(head) : i % len(head) + 1])
            except OSError:
                pass
        i += 1
    time.sleep(0.5)
"""


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--attackers", type=int, default=1100, help="connections the attacker opens")
    p.add_argument("--nofile", type=int, default=1024, help="the server's file limit")
    p.add_argument("--good", type=int, default=50, help="good requests, each on a new client")
    p.add_argument("--slow", action="store_true", help="drip request heads instead of silence")
    p.add_argument("--hold", type=float, default=20.0, help="how long the attacker holds on")
    return p.parse_args()


async def _good_requests(port: int, count: int) -> tuple[int, list[float]]:
    ok = 0
    latencies: list[float] = []
    for _ in range(count):
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as c:
                r = await c.post("/v2/models/add/infer", json=BODY)
            ok += r.status_code == 200
        except (httpx.HTTPError, OSError):
            pass  # refused, reset, or no descriptor left for the client either
        latencies.append(time.monotonic() - started)
    return ok, latencies


async def main() -> None:
    args = _args()
    attacker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ATTACKER,
        str(args.attackers),
        "1" if args.slow else "0",
        str(args.hold),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert attacker.stdin is not None
    assert attacker.stdout is not None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = min(args.nofile, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_add_onnx(root / "add" / "1" / "model.onnx", 1.0)
        cfg = root / "modelyard.yaml"
        models = [{"name": "add", "path": "add", "isolation": "inline", "preload": True}]
        cfg.write_text(yaml.safe_dump({"model_repository": ".", "models": models}))
        settings = load_settings(cfg, host="127.0.0.1", http_port=0)
        settings = settings.model_copy(update={"grpc_port": None})
        app = App(settings)
        await app.start()
        try:
            port = app.http_port
            assert port is not None
            attacker.stdin.write(f"{port}\n".encode())
            await attacker.stdin.drain()
            opened = int((await attacker.stdout.readline()).decode().strip() or 0)
            await asyncio.sleep(1.0)
            ok, latencies = await _good_requests(port, args.good)
            held: Any = len(app._http.server_state.connections) if app._http else "?"
            attacker.kill()
            await attacker.wait()
        finally:
            if attacker.returncode is None:
                attacker.kill()
            await app.stop()
    limits: Any = getattr(settings, "limits", None)  # None: a checkout before issue 12
    bounds = (
        f"limits.max_connections {limits.max_connections}, "
        f"header_timeout_s {limits.header_timeout_s}"
        if limits is not None
        else "no limits block"
    )
    print(
        f"attacker opened {opened} {'slow' if args.slow else 'silent'} connections; server "
        f"file limit {args.nofile}, {bounds}"
    )
    print(f"server held {held} connections")
    print(
        f"good requests: {ok}/{args.good} answered 200; latency median "
        f"{statistics.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
