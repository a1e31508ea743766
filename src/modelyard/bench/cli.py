"""``modelyard bench``: flags → :class:`BenchConfig` → :func:`run_bench` → table and files."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from modelyard.bench.config import BenchConfig
from modelyard.bench.errors import BenchConfigError, BenchError, EngineUnavailableError
from modelyard.bench.report import (
    format_table,
    require_matplotlib,
    write_csv,
    write_json,
    write_plot,
)
from modelyard.bench.results import BenchResult
from modelyard.bench.runner import run_bench
from modelyard.bench.workload import MixSpec

_T = TypeVar("_T")

TOKEN_ENV = "MODELYARD_TOKEN"
"""Where ``--token`` is read from when the flag is absent (as for the other client verbs)."""
_OPEN_LOOP_CONCURRENCY = 64
"""Default cap on requests in flight in open loop, where concurrency is not the load."""

_EPILOG = """\
examples:
  modelyard bench --url http://127.0.0.1:8080 --concurrency 1,8,32 --duration 10
  modelyard bench --models resnet,bert --mix zipf:1.1 --requests 5000 --json out.json
  modelyard bench --rate 100,200,400 --duration 20 --csv sweep.csv --plot sweep.png
  modelyard bench --mix trace:requests.csv --rate trace
  modelyard bench --grpc 127.0.0.1:8081 --models resnet --concurrency 16
"""


def add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``bench`` sub-command; its handler is :func:`run_bench_command`."""
    parser = subparsers.add_parser(
        "bench",
        help="load-test a KServe v2 server (modelyard, MLServer, Triton)",
        description=(
            "Send inference requests to a KServe v2 / Open Inference Protocol server and\n"
            "report latency, throughput and errors per concurrency level or target rate."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run_bench_command)
    target = parser.add_argument_group("target")
    target.add_argument(
        "--url", default="http://127.0.0.1:8080", help="REST base URL (%(default)s)"
    )
    target.add_argument(
        "--grpc", metavar="HOST:PORT", help="send over gRPC to this address instead"
    )
    target.add_argument(
        "--token",
        help=(
            "Bearer token sent with every request (default: $MODELYARD_TOKEN, else none); "
            "discovery without --models needs the management token"
        ),
    )
    target.add_argument(
        "--cacert",
        type=Path,
        metavar="PEM",
        help="CA bundle to trust: for an https:// --url (with --http-client aiohttp), "
        "or TLS for --grpc",
    )
    target.add_argument(
        "--models", metavar="A,B,C", help="models to send to (default: every READY model)"
    )
    target.add_argument(
        "--payload",
        action="append",
        default=[],
        metavar="MODEL=FILE",
        help="send this v2 JSON request body to MODEL instead of random data (repeatable)",
    )
    load = parser.add_argument_group("load")
    load.add_argument(
        "--mix", default="uniform", help="uniform | zipf[:S] | trace:FILE (default: uniform)"
    )
    load.add_argument(
        "--concurrency",
        metavar="N[,N...]",
        help=(
            f"requests in flight, one phase each (default: 1; open loop: {_OPEN_LOOP_CONCURRENCY})"
        ),
    )
    amount = load.add_mutually_exclusive_group()
    amount.add_argument(
        "--duration",
        type=float,
        default=10.0,
        metavar="S",
        help="measured seconds per phase (%(default)s)",
    )
    amount.add_argument("--requests", type=int, metavar="N", help="measured requests per phase")
    load.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        metavar="S",
        help="unmeasured seconds first (%(default)s)",
    )
    load.add_argument(
        "--rate",
        metavar="R[,R...]|trace",
        help=(
            "open loop: Poisson arrivals per second, one phase each; "
            "'trace' replays the trace's own times"
        ),
    )
    load.add_argument(
        "--seed", type=int, default=0, help="seed for mix, payloads, arrivals (%(default)s)"
    )
    load.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="per-request timeout (%(default)s)"
    )
    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--engine", choices=("python", "wrk"), default="python", help="who sends (%(default)s)"
    )
    engine.add_argument(
        "--http-client",
        choices=("raw", "aiohttp"),
        default="raw",
        help=(
            "Python REST client: raw keep-alive streams or aiohttp "
            "(%(default)s; HTTPS needs aiohttp)"
        ),
    )
    output = parser.add_argument_group("output")
    output.add_argument("--json", type=Path, metavar="OUT", help="write results as JSON")
    output.add_argument("--csv", type=Path, metavar="OUT", help="write results as CSV")
    output.add_argument(
        "--plot", type=Path, metavar="OUT.png", help="plot latency vs throughput (needs matplotlib)"
    )
    output.add_argument(
        "--progress", action="store_true", help="live progress on stderr (default: when a tty)"
    )


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Build the :class:`BenchConfig` the flags describe; raises :class:`BenchConfigError`."""
    mix = MixSpec.parse(args.mix)
    rate_text = (args.rate or "").strip()
    replay = rate_text.lower() == "trace"
    rates = () if replay or not rate_text else _number_list(rate_text, float, "--rate")
    open_loop = replay or bool(rates)
    default_concurrency = (_OPEN_LOOP_CONCURRENCY,) if open_loop else (1,)
    concurrency = (
        _number_list(args.concurrency, int, "--concurrency")
        if args.concurrency
        else default_concurrency
    )
    payloads: dict[str, Path] = {}
    for item in args.payload:
        model, sep, path = item.partition("=")
        if not sep or not model or not path:
            raise BenchConfigError(f"--payload must be MODEL=FILE, got {item!r}")
        payloads[model] = Path(path)
    models = tuple(m.strip() for m in (args.models or "").split(",") if m.strip())
    try:
        return BenchConfig(
            url=args.url,
            grpc_target=args.grpc,
            token=args.token or os.environ.get(TOKEN_ENV) or None,
            ca_file=args.cacert,
            models=models,
            mix=mix,
            concurrency=concurrency,
            rates=rates,
            replay_trace_timing=replay,
            duration_s=args.duration,
            requests=args.requests,
            warmup_s=args.warmup,
            engine=args.engine,
            http_client=args.http_client,
            payload_files=payloads,
            seed=args.seed,
            request_timeout_s=args.timeout,
            progress=args.progress or sys.stderr.isatty(),
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors()
        )
        raise BenchConfigError(problems) from None


def run_bench_command(args: argparse.Namespace) -> int:
    """Run ``modelyard bench``; returns the exit status (0 ok, 1 could not run, 2 bad usage)."""
    try:
        config = config_from_args(args)
        if args.plot is not None:
            require_matplotlib()
        if config.engine == "wrk" and shutil.which("wrk") is None:
            raise EngineUnavailableError("--engine wrk needs the wrk tool on PATH")
        results = _run(config)
    except BenchConfigError as exc:
        print(f"modelyard bench: {exc}", file=sys.stderr)
        return 2
    except BenchError as exc:
        print(f"modelyard bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("modelyard bench: interrupted", file=sys.stderr)
        return 130
    print(format_table(results))
    try:
        if args.json is not None:
            write_json(results, args.json, config=config.model_dump(mode="json"))
        if args.csv is not None:
            write_csv(results, args.csv)
        if args.plot is not None:
            write_plot(results, args.plot)
    except (OSError, BenchError) as exc:
        print(f"modelyard bench: cannot write results: {exc}", file=sys.stderr)
        return 1
    return 0


def _run(config: BenchConfig) -> list[BenchResult]:
    # uvloop, when installed, trims the raw client's CPU per request by about a fifth.
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run_bench(config))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run_bench(config))


def _number_list(text: str, kind: Callable[[str], _T], flag: str) -> tuple[_T, ...]:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BenchConfigError(f"{flag} takes comma-separated numbers, got {text!r}") from None
