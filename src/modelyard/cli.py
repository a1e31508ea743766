"""modelyard: serve many models from one repository, more than fit in memory at once.

Start with `modelyard example DIR` (builds a small model repository locally), then
`modelyard serve --config DIR/modelyard.yaml`; README.md's quick start has the rest.
"""

# The command parses arguments, builds settings and runs: no logic of its own. Heavy
# modules (numpy, pydantic, the runtimes) are imported inside the verbs that need them,
# so that `--help` and the client verbs start in a fraction of a second.

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelyard.config.settings import ServerSettings


def _serve(args: argparse.Namespace) -> int:
    from modelyard.config.settings import ConfigError, load_settings
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
            exit_on_error=args.exit_on_error,
        )
    except ConfigError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return 2
    if args.config is None and not settings.models:
        print(NO_CONFIG_NOTICE, file=sys.stderr)
    if args.ray:
        settings = with_ray(settings, args.ray)
    setup_logging(settings.log_level, settings.log_format)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from modelyard.app import StartupError

    try:
        from modelyard.ray_app import make_app

        asyncio.run(make_app(settings).run_forever())
    except StartupError as exc:
        print(f"modelyard: {exc}", file=sys.stderr)
        return 1
    return 0


NO_CONFIG_NOTICE = (
    "modelyard: no --config given, so no models are declared (explicit or poll mode can "
    "still load some); `modelyard example DIR` builds a repository and its modelyard.yaml"
)
"""What ``serve`` says when it starts with no configuration file and no models."""


def with_ray(settings: ServerSettings, address: str) -> ServerSettings:
    """``settings`` in Ray mode at ``address`` (``--ray``), keeping the YAML's other
    ``ray:`` keys."""
    from modelyard.config.ray import RayConfig

    ray = (settings.ray or RayConfig()).model_copy(update={"address": address})
    return settings.model_copy(update={"ray": ray})


def _example(args: argparse.Namespace) -> int:
    from modelyard.examples.repository import build_example_repository

    llm_sizes: tuple[str, ...] | None = None
    if args.no_llm:
        llm_sizes = ()
    elif args.llm_medium:
        llm_sizes = ("tiny", "small", "medium")
    config = build_example_repository(
        Path(args.dir), include_minilm=False if args.no_minilm else None, llm_sizes=llm_sizes
    )
    print(f"example repository ready: {config}")
    for line in _left_out(args):
        print(line)
    print(f"start it with: modelyard serve --config {config}")
    return 0


def _left_out(args: argparse.Namespace) -> list[str]:
    """A line for each optional example model this build left out, and what brings it."""
    from modelyard.examples.minilm import minilm_available
    from modelyard.examples.repository import llm_available

    lines = []
    if args.no_llm:
        lines.append("left out: the GGUF text generators (--no-llm)")
    elif not llm_available():
        lines.append(
            "left out: the GGUF text generators (llama-*), which need the llm extra: "
            "EXTRAS=llm ./scripts/serve-example.sh, or pip install 'modelyard[llm]' "
            "(compiles llama.cpp: minutes)"
        )
    if args.no_minilm:
        lines.append("left out: the MiniLM encoder (--no-minilm)")
    elif not minilm_available():
        lines.append(
            "left out: the MiniLM encoder (minilm), which needs the torch extra: "
            "EXTRAS=torch ./scripts/serve-example.sh, or pip install 'modelyard[torch]'"
        )
    return lines


TOKEN_ENV = "MODELYARD_TOKEN"
"""Environment variable the client verbs read the server's token from (``--token`` wins)."""


def client_token(args: argparse.Namespace) -> str | None:
    """The token a client verb sends: ``--token``, else ``$MODELYARD_TOKEN``, else none."""
    token: str | None = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
    return token


def _http_options(args: argparse.Namespace) -> dict[str, Any]:
    """httpx keyword arguments for a client verb: the Bearer header and the CA to trust."""
    options: dict[str, Any] = {}
    token = client_token(args)
    if token is not None:
        options["headers"] = {"authorization": f"Bearer {token}"}
    if args.cacert is not None:
        import ssl

        options["verify"] = ssl.create_default_context(cafile=args.cacert)
    return options


def _refused(url: str, response: Any) -> int:
    try:
        reason = response.json().get("error", response.text)
    except ValueError:
        reason = response.text
    print(f"modelyard: {url}: HTTP {response.status_code}: {reason}", file=sys.stderr)
    if response.status_code == 401:
        print(f"modelyard: pass --token or set {TOKEN_ENV}", file=sys.stderr)
    return 1


def _models(args: argparse.Namespace) -> int:
    import httpx

    url = args.url.rstrip("/")
    try:
        r = httpx.post(f"{url}/v2/repository/index", json={}, timeout=10, **_http_options(args))
    except (httpx.HTTPError, OSError) as exc:
        print(f"modelyard: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        return _refused(url, r)
    rows = r.json()
    print(f"{'MODEL':32} {'VERSION':8} {'STATE':10} REASON")
    for row in rows:
        print(f"{row['name']:32} {row['version']:8} {row['state']:10} {row.get('reason', '')}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    from modelyard.repository.layout import list_versions, repository_models
    from modelyard.repository.manifest import write_manifest

    target = Path(args.dir)
    if not target.is_dir():
        print(f"modelyard: {target} is not a folder", file=sys.stderr)
        return 2
    # A model folder (with integer version folders) or one version folder. A repository
    # root would get one manifest covering every model, which no version would verify
    # against: refuse it and say what to give instead.
    versions = [target / str(v) for v in list_versions(target)] or [target]
    models = repository_models(target) if versions == [target] else []
    if models:
        shown = ", ".join(models[:3]) + (", …" if len(models) > 3 else "")
        print(
            f"modelyard: {target} is a model repository (model folders: {shown}); give a "
            f"model folder (every version gets a manifest), e.g. {target / models[0]}, "
            "or one version folder",
            file=sys.stderr,
        )
        return 2
    key = Path(args.key) if args.key else None
    for vdir in versions:
        print(write_manifest(vdir, key))
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = Path(args.out)
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    private.chmod(0o600)
    public = private.with_suffix(".pub.pem")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    print(f"private key: {private}\npublic key:  {public} (list it in manifest_public_keys)")
    return 0


def _post(args: argparse.Namespace, url: str, body: dict[str, object]) -> int:
    import httpx

    try:
        r = httpx.post(url, json=body, timeout=300, **_http_options(args))
    except (httpx.HTTPError, OSError) as exc:
        print(f"modelyard: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if r.status_code != 200:
        return _refused(url, r)
    print(r.text)
    return 0


def _rollback(args: argparse.Namespace) -> int:
    url = f"{args.url.rstrip('/')}/v2/repository/models/{args.model}/rollback"
    return _post(args, url, {"alias": args.alias})


def _alias(args: argparse.Namespace) -> int:
    targets: dict[str, object] = {}
    for item in args.versions:
        version, _, weight = item.partition("=")
        targets[version] = float(weight) if weight else 1.0
    url = f"{args.url.rstrip('/')}/v2/repository/models/{args.model}/aliases/{args.alias}"
    return _post(args, url, {"versions": targets})


def _port_or_off(text: str) -> int | str:
    """A port number, or a word for "off" that the settings turn into no gRPC server."""
    from modelyard.config.settings import OFF_WORDS

    if text.strip().lower() in OFF_WORDS:
        return "off"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number or 'off': {text!r}") from None


def _load_slots(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"not a number of load slots (0 or more): {text!r}")
    return n


def _plan(args: argparse.Namespace) -> int:
    import json

    from modelyard.simulation.plan import format_table, plan, slots_for
    from modelyard.simulation.traces import read_request_log

    path = Path(args.trace)
    if not path.is_file():
        print(f"modelyard: {path} is not a file", file=sys.stderr)
        return 2
    trace = read_request_log(path)
    if not trace.requests:
        print(f"modelyard: {path} holds no request lines", file=sys.stderr)
        return 2
    policies = args.policies.split(",") if args.policies else None
    from modelyard.manager.eviction import POLICY_NAMES

    unknown = [p for p in policies or [] if p not in POLICY_NAMES]
    if unknown:
        print(f"modelyard: unknown policy {', '.join(unknown)}", file=sys.stderr)
        return 2
    slots = slots_for(trace, args.load_slots)
    rows = plan(
        trace, budgets_mib=args.budget_mb, policies=policies or POLICY_NAMES, load_slots=slots
    )
    if args.json:
        print(
            json.dumps(
                [
                    {"budget_mib": r.budget_mib, "load_slots": slots, **r.result.as_row()}
                    for r in rows
                ]
            )
        )
    else:
        print(format_table(trace, rows, slots))
    return 0


def build_parser(*, with_bench: bool = True) -> argparse.ArgumentParser:
    """The argument parser of every sub-command (``with_bench=False``: ``bench`` listed
    but its options not built, which would import the load generator)."""
    parser = argparse.ArgumentParser(prog="modelyard", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the server")
    serve.add_argument(
        "--config",
        "-c",
        help="modelyard.yaml (default: none, which serves no models; "
        "`modelyard example DIR` writes one)",
    )
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, help="REST port (default 8080)")
    serve.add_argument(
        "--grpc-port", type=_port_or_off, help="gRPC port (default 8081; off disables gRPC)"
    )
    serve.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        help="run model workers as actors on a Ray cluster (docs/ray.md; the 'ray' extra)",
    )
    serve.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="least severe log lines written (default info)",
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="text for a terminal, json (one object a line) for a log collector (default text)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=["none", "explicit", "poll"],
        help="none: serve the YAML's models; explicit: also load and unload through the "
        "repository API; poll: follow version folders as they appear (default none)",
    )
    serve.add_argument(
        "--exit-on-error",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="stop the start when a preloaded model cannot serve (default: yes)",
    )
    serve.set_defaults(func=_serve)

    planner = sub.add_parser(
        "plan", help="replay a request log: cold starts per eviction policy and budget"
    )
    planner.add_argument(
        "--trace", required=True, help="a request log (request_log: path) or trace file"
    )
    planner.add_argument(
        "--budget-mb",
        type=float,
        nargs="+",
        help="budgets to try in MiB (default: 10-100 %% of all the models together)",
    )
    planner.add_argument("--policies", help="comma-separated (default: every policy)")
    planner.add_argument(
        "--load-slots",
        type=_load_slots,
        metavar="N",
        help="loads that run at once, as the server's load_slots (0: no limit; default: "
        "what the log's server ran with, else the server's default, no limit)",
    )
    planner.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    planner.set_defaults(func=_plan)

    example = sub.add_parser("example", help="build an example model repository locally")
    example.add_argument("dir", help="folder to build it in")
    example.add_argument("--no-minilm", action="store_true", help="skip the MiniLM encoder")
    example.add_argument(
        "--no-llm", action="store_true", help="skip the GGUF text generators (llm extra)"
    )
    example.add_argument(
        "--llm-medium", action="store_true", help="also write the 250 MB GGUF text generator"
    )
    example.set_defaults(func=_example)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument("--url", default="http://127.0.0.1:8080", help="server (%(default)s)")
    client.add_argument(
        "--token", help=f"management token to send (default: ${TOKEN_ENV}, else none)"
    )
    client.add_argument("--cacert", help="PEM CA bundle to trust for an https:// --url")

    models = sub.add_parser(
        "models", parents=[client], help="list models and states of a running server"
    )
    models.set_defaults(func=_models)

    manifest = sub.add_parser("manifest", help="write SHA256 manifests for model versions")
    manifest.add_argument("dir", help="a model folder (every version) or one version folder")
    manifest.add_argument("--key", help="Ed25519 private key (PEM) to sign with")
    manifest.set_defaults(func=_manifest)

    keygen = sub.add_parser("keygen", help="make an Ed25519 key pair for signing manifests")
    keygen.add_argument("out", help="private key file to write (public key beside it)")
    keygen.set_defaults(func=_keygen)

    rollback = sub.add_parser(
        "rollback", parents=[client], help="move an alias back to its previous version"
    )
    rollback.add_argument("model")
    rollback.add_argument("--alias", default="default")
    rollback.set_defaults(func=_rollback)

    alias = sub.add_parser(
        "alias", parents=[client], help="point an alias at versions (blue-green switch)"
    )
    alias.add_argument("model")
    alias.add_argument("alias")
    alias.add_argument("versions", nargs="+", help="VERSION or VERSION=WEIGHT (canary split)")
    alias.set_defaults(func=_alias)

    if with_bench:
        _add_bench(sub)
    else:
        # Listed in --help without importing the load generator (aiohttp, numpy): the
        # real parser is built only when the command is `bench` (see main).
        sub.add_parser("bench", help=_BENCH_HELP, add_help=False)
    return parser


_BENCH_HELP = "load-test a KServe v2 server (modelyard, MLServer, Triton)"


def _add_bench(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    try:
        from modelyard.bench.cli import add_bench_parser, run_bench_command
    except ImportError as exc:
        missing = exc
        bench = sub.add_parser("bench", help=_BENCH_HELP, add_help=False)
        bench.set_defaults(func=lambda _args: _bench_missing(missing))
        return
    add_bench_parser(sub)
    sub.choices["bench"].set_defaults(func=run_bench_command)


def _bench_missing(exc: ImportError) -> int:
    print(
        f"modelyard: `modelyard bench` needs the bench extra ({exc.name or exc} is missing): "
        "pip install 'modelyard[bench]' (or EXTRAS=bench ./scripts/install.sh)",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``modelyard`` console script."""
    argv = sys.argv[1:] if argv is None else argv
    is_bench = bool(argv) and argv[0] == "bench"
    if is_bench:
        try:
            import modelyard.bench.cli  # noqa: F401  # the extra's modules
        except ImportError as exc:  # whatever options follow: the extra is missing
            return _bench_missing(exc)
    parser = build_parser(with_bench=is_bench)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
