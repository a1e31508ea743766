"""Where one infer request's server CPU goes, without HTTP: cProfile of the hot path.

Run from the repository root::

    .venv/bin/python bench/profile_hot_path.py                  # both isolations
    .venv/bin/python bench/profile_hot_path.py --isolation process --calls 3000
    .venv/bin/python bench/profile_hot_path.py --http                       # HTTP included
    .venv/bin/python bench/profile_hot_path.py --http --concurrency 50
    .venv/bin/python bench/profile_hot_path.py --isolation process --minilm --concurrency 16

With ``--http`` the requests come over loopback HTTP from a client in another process
(each written whole, as ``bench_overhead.py``'s client does), so uvicorn's protocol, the
raw infer read and the socket write are counted too; ``--concurrency`` opens that many
connections, each sending its next request once its answer is in (without ``--http``,
that many requests at once in-process, so a queue forms as under load). ``--minilm``
serves MiniLM as ``bench_replicas.py`` does (one replica pinned to ``cpu:0``, batches of
up to 8).

No py-spy or perf needed. The server's ``App`` runs in this process on the identity model
(FP32 [1, 4]); the request body is decoded, run and encoded by the same
:class:`~modelyard.frontends.http.fastpath.InferHandler` the HTTP route calls, one request
at a time, in a loop. Printed per isolation:

* the event-loop thread's CPU and wall time per request without a profiler (HTTP
  parsing and the socket write are not in it: ``bench/bench_overhead.py`` has those),
  and, with process isolation, the worker's CPU per request;
* with cProfile on: the Python function calls per request (a count, so the same on a
  quiet or a busy machine: the A/B figure least disturbed by other load), self time per
  request grouped by module (``--top`` rows), and the functions with the most self time.
  cProfile adds a fixed cost to every Python call: read shares, not absolute times.
  Blocking calls that wake another process (the channel's ``send``) include the time the
  woken process runs on a busy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _server
import psutil
import yaml

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.examples.mlp import build_identity_onnx
from modelyard.frontends.http.fastpath import InferHandler

BODY = json.dumps(
    {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 4],
                "datatype": "FP32",
                "data": [0.1234, 0.5678, 0.9012, 0.3456],
            }
        ]
    }
).encode()


def _group(stats: pstats.Stats, calls: int, top: int, counts: int) -> None:
    by_module: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    calls_by_function: collections.Counter[str] = collections.Counter()
    for (path, _line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        self_s = row[2]
        module = path.split("site-packages/")[-1].split("src/")[-1]
        if "modelyard/" not in module:
            module = module.split("/")[0] if "/" in module else name
        by_module[module] += self_s
        key = f"{module}:{name}" if module != name else name
        by_function[key] += self_s
        calls_by_function[key] += row[1]
    for title, counter in (("module", by_module), ("function", by_function)):
        print(f"\nself time per request by {title} (µs, under cProfile):")
        for key, seconds in counter.most_common(top):
            print(f"  {seconds / calls * 1e6:8.1f}  {key}")
    if counts:
        print("\nPython calls per request by function (exact):")
        for key, n in calls_by_function.most_common(counts):
            print(f"  {n / calls:8.2f}  {key}")


def _model(root: Path, isolation: str, minilm: bool) -> tuple[dict[str, Any], bytes]:
    """The model entry and request body: the identity model, or MiniLM as
    ``bench_replicas`` serves it (one replica on ``cpu:0``, batches of up to 8)."""
    if not minilm:
        build_identity_onnx(root / "identity" / "1" / "model.onnx")
        return {"name": "m", "path": "identity", "isolation": isolation, "preload": True}, BODY
    from bench_batching import write_payload

    from modelyard.examples.minilm import export_minilm_onnx

    print("exporting MiniLM to ONNX ...", file=sys.stderr)
    export_minilm_onnx(root / "minilm" / "1" / "model.onnx")
    entry = {"name": "m", "path": "minilm", "isolation": isolation, "preload": True}
    entry |= {"max_batch_size": 8, "max_queue_size": 1024, "memory_mb": 300}
    entry["devices"] = ["cpu:0"]
    return entry, write_payload(root / "payload.json").read_bytes()


def _config(root: Path, entry: dict[str, Any]) -> Path:
    path = _server.write_config(root, [entry])
    if entry.get("devices") == ["cpu:0"]:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
        config["devices"].append({"name": "cpu:0", "memory_budget_mb": 1024})
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


async def _requests(handler: InferHandler, body: bytes, calls: int, concurrency: int) -> None:
    """``calls`` requests from ``concurrency`` closed-loop clients."""

    async def client(n: int) -> None:
        for _ in range(n):
            await handler.infer_body("m", None, body, None, None, None)

    await asyncio.gather(*(client(calls // concurrency) for _ in range(concurrency)))


# A client in another process: ``calls`` requests over ``concurrency`` connections, each
# connection sending its next request when its answer is in, every request written whole
# (as bench_overhead's raw client does), so only the server is profiled.
_CLIENT = r"""
import selectors, socket, sys
port, calls, concurrency = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
request = sys.stdin.buffer.read()
sel = selectors.DefaultSelector()
sent = 0
for _ in range(min(concurrency, calls)):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(request)
    sent += 1
    sel.register(s, selectors.EVENT_READ, [b""])
done = 0
while done < calls:
    for key, _ in sel.select():
        s, state = key.fileobj, key.data
        state[0] += s.recv(65536)
        buf = state[0]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            continue
        head = buf[:end].lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        if len(buf) < end + 4 + length:
            continue
        if not head.startswith(b"http/1.1 200"):
            sys.exit("not 200: " + buf.decode("latin-1"))
        state[0] = buf[end + 4 + length:]
        done += 1
        if sent < calls:
            s.sendall(request)
            sent += 1
"""


def _request(body: bytes) -> bytes:
    return (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + b"content-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


async def _client(port: int, body: bytes, calls: int, concurrency: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CLIENT,
        str(port),
        str(calls),
        str(concurrency),
        stdin=asyncio.subprocess.PIPE,
    )
    await proc.communicate(_request(body))
    if proc.returncode:
        raise SystemExit(f"client failed: {proc.returncode}")


async def one(
    isolation: str,
    calls: int,
    top: int,
    http: bool,
    concurrency: int,
    minilm: bool,
    counts: int = 0,
    dump: Path | None = None,
    cprofile: bool = True,
) -> None:
    calls -= calls % concurrency
    with tempfile.TemporaryDirectory(prefix="profile-hot-path-") as tmp:
        root = Path(tmp)
        entry, body = _model(root, isolation, minilm)
        cfg = _config(root, entry)
        settings = load_settings(cfg, host="127.0.0.1", http_port=0, grpc_port=None)
        app = App(settings)
        await app.start()
        try:
            handler = InferHandler(app.dataplane, 1 << 20)

            async def run(n: int) -> None:
                if http:  # the whole server path, HTTP parse and socket write included
                    assert app.http_port is not None
                    await _client(app.http_port, body, n, concurrency)
                    return
                await _requests(handler, body, n, concurrency)

            await run(500 - 500 % concurrency)
            workers = psutil.Process().children(recursive=True)
            cpu0 = time.thread_time()
            usage0 = resource.getrusage(resource.RUSAGE_THREAD)
            wall0 = time.perf_counter()
            kids0 = sum(sum(w.cpu_times()[:2]) for w in workers)
            await run(calls)
            cpu = (time.thread_time() - cpu0) / calls * 1e6
            usage = resource.getrusage(resource.RUSAGE_THREAD)
            user = (usage.ru_utime - usage0.ru_utime) / calls * 1e6
            system = (usage.ru_stime - usage0.ru_stime) / calls * 1e6
            wall = (time.perf_counter() - wall0) / calls * 1e6
            kids = (sum(sum(w.cpu_times()[:2]) for w in workers) - kids0) / calls * 1e6
            model = "MiniLM" if minilm else "identity"
            over = " over HTTP" if http else ""
            print(
                f"\n== {model}, isolation: {isolation}; {calls} requests{over}, "
                f"{concurrency} at once"
            )
            print(
                f"event-loop thread: {cpu:.0f} µs CPU (user {user:.0f}, system {system:.0f}), "
                f"{wall:.0f} µs wall per request; "
                f"other processes of the server (workers): {kids:.0f} µs CPU per request"
            )
            if not cprofile:
                return
            profile = cProfile.Profile()
            profile.enable()
            await run(calls)
            profile.disable()
            stats = pstats.Stats(profile)
            if dump is not None:  # for pstats' print_callers and friends
                stats.dump_stats(dump.with_suffix(f".{isolation}.prof"))
            # Deterministic, unlike any time on a shared machine: the A/B figure to trust.
            python_calls = sum(row[1] for row in stats.stats.values())  # type: ignore[attr-defined]
            print(f"Python function calls per request: {python_calls / calls:.1f}")
            _group(stats, calls, top, counts)
        finally:
            await app.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--isolation", choices=("process", "inline", "both"), default="both")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--counts",
        type=int,
        default=0,
        help="also list this many functions by Python calls per request (exact, noise-free)",
    )
    parser.add_argument(
        "--no-cprofile",
        action="store_true",
        help="time only (for a sampling profiler such as py-spy attached from outside)",
    )
    parser.add_argument(
        "--dump",
        type=Path,
        help="write the cProfile stats to DUMP.<isolation>.prof (read them with pstats)",
    )
    parser.add_argument(
        "--http",
        action="store_true",
        help="send the requests over HTTP from a client process (HTTP parse and write included)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="requests at once (1): connections of the --http client, else in-process",
    )
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="MiniLM (batches of up to 8 on cpu:0, needs the torch extra) instead of identity",
    )
    args = parser.parse_args()
    _server.install_uvloop()
    isolations = ("process", "inline") if args.isolation == "both" else (args.isolation,)
    for isolation in isolations:
        asyncio.run(
            one(
                isolation,
                args.calls,
                args.top,
                args.http,
                args.concurrency,
                args.minilm,
                args.counts,
                args.dump,
                not args.no_cprofile,
            )
        )
    print(f"\nload average {psutil.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
