"""The ``modelyard`` command: parse arguments, build settings, run. No logic of its own."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from modelyard.config.settings import ConfigError, load_settings


def _serve(args: argparse.Namespace) -> int:
    from modelyard.app import App
    from modelyard.observability.logging import setup_logging

    try:
        settings = load_settings(
            args.config,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            log_level=args.log_level,
            log_format=args.log_format,
            model_control_mode=args.model_control_mode,
        )
    except ConfigError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(App(settings).run_forever())
    return 0


def _example(args: argparse.Namespace) -> int:
    from modelyard.examples.repository import build_example_repository

    config = build_example_repository(
        Path(args.dir), include_minilm=False if args.no_minilm else None
    )
    print(f"example repository ready: {config}")
    print(f"start it with: modelyard serve --config {config}")
    return 0


def _models(args: argparse.Namespace) -> int:
    import httpx

    url = args.url.rstrip("/")
    try:
        rows = httpx.post(f"{url}/v2/repository/index", json={}, timeout=10).json()
    except httpx.HTTPError as exc:
        print(f"modelyard: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{'MODEL':32} {'VERSION':8} {'STATE':10} REASON")
    for row in rows:
        print(f"{row['name']:32} {row['version']:8} {row['state']:10} {row.get('reason', '')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = argparse.ArgumentParser(prog="modelyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the server")
    serve.add_argument("--config", "-c", help="modelyard.yaml (default: none)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="REST port (default 8080)")
    serve.add_argument("--grpc-port", type=int, help="gRPC port (default 8081)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", choices=["text", "json"])
    serve.add_argument("--model-control-mode", choices=["none", "explicit", "poll"])
    serve.set_defaults(func=_serve)

    example = sub.add_parser("example", help="build an example model repository locally")
    example.add_argument("dir", help="folder to build it in")
    example.add_argument("--no-minilm", action="store_true", help="skip the MiniLM encoder")
    example.set_defaults(func=_example)

    models = sub.add_parser("models", help="list models and states of a running server")
    models.add_argument("--url", default="http://127.0.0.1:8080")
    models.set_defaults(func=_models)

    try:
        from modelyard.bench.cli import add_bench_parser, run_bench_command
    except ImportError:
        pass
    else:
        add_bench_parser(sub)
        sub.choices["bench"].set_defaults(func=run_bench_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``modelyard`` console script."""
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
