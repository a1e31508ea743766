"""Benchmark modelyard against Seldon MLServer and NVIDIA PyTriton on the digits workload.

Run with the modelyard venv from the repository root, after ``setup_mlserver.sh`` and
``setup_pytriton.sh`` (a server whose venv is missing is skipped and reported)::

    .venv/bin/python bench/peers/run_peers.py --concurrency 1,8,50 --duration 15 --rounds 2

Each round starts every server afresh, in an order that alternates between rounds, and for
each one: waits until all five models are ready; checks one inference per model (and that
the servers agree on the label); runs ``modelyard bench`` (closed loop, uniform mix, batch 1,
the same request bytes for every server); measures the memory of the server's whole process
tree; times a cold start of one model; stops it. Results go to ``bench/results/peers.json``
and a markdown table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from peer_probes import ProbeError, cold_start, infer, predicted_label, wait_ready, write_payloads
from peer_servers import (
    HERE,
    MemorySample,
    RunningServer,
    ServerSpec,
    package_versions,
    venv_python,
)
from peer_summary import markdown, summarise

REPO_ROOT = HERE.parent.parent
WORK = HERE / "scratch"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "peers.json"
ALL_SERVERS = ("modelyard", "mlserver", "pytriton")


def build_workload(isolation: str) -> tuple[Path, list[str], list[float]]:
    """The digits workload's YAML (with ``isolation`` applied), its models and one input row."""
    from modelyard.examples.repository import build_digits_workload, digits_sample

    config = build_digits_workload(WORK / "digits")
    document = yaml.safe_load(config.read_text())
    models = [item["name"] for item in document["models"]]
    if isolation != "as-configured":
        for item in document["models"]:
            item["isolation"] = isolation
        # Beside the original, so the relative ``model_repository: .`` still resolves.
        config = config.with_name(f"modelyard.{isolation}.yaml")
        config.write_text(yaml.safe_dump(document, sort_keys=False))
    row = [float(v) for v in digits_sample(1)[0].tolist()]
    return config, models, row


def server_specs(
    args: argparse.Namespace, config: Path, models: list[str]
) -> dict[str, ServerSpec]:
    """The command line and ports of each server (ports from ``--base-port``)."""
    base = args.base_port
    token = secrets.token_urlsafe(16)
    return {
        "modelyard": ServerSpec(
            name="modelyard",
            http_port=base,
            ports=(base, base + 1),
            command=(
                sys.executable,
                "-m",
                "modelyard.cli",
                "serve",
                "--config",
                str(config),
                "--http-port",
                str(base),
                "--grpc-port",
                str(base + 1),
                "--log-level",
                "warning",
            ),
        ),
        "mlserver": ServerSpec(
            name="mlserver",
            http_port=base + 10,
            ports=(base + 10, base + 11, base + 12),
            # Trains and pickles with this (modelyard) venv, then execs the MLServer venv's CLI.
            command=(
                sys.executable,
                str(HERE / "serve_mlserver.py"),
                "--work",
                str(WORK / "mlserver"),
                "--http-port",
                str(base + 10),
                "--grpc-port",
                str(base + 11),
                "--metrics-port",
                str(base + 12),
                "--max-batch-size",
                str(args.mlserver_max_batch_size),
                "--max-batch-time-s",
                str(args.mlserver_max_batch_time_s),
            ),
        ),
        "pytriton": ServerSpec(
            name="pytriton",
            http_port=base + 20,
            ports=(base + 20, base + 21, base + 22),
            command=(
                str(venv_python("pytriton")),
                str(HERE / "serve_pytriton.py"),
                "--repo",
                str(config.parent),
                "--models",
                ",".join(models),
                "--http-port",
                str(base + 20),
                "--grpc-port",
                str(base + 21),
                "--metrics-port",
                str(base + 22),
                "--timings",
                str(WORK / "pytriton-timings.json"),
            ),
            env={"PYTRITON_ACCESS_TOKEN": token},
            repository_headers={"triton-access-token": token},
            # PyTriton loads models by uploading their config and files with the load request;
            # a plain repository load after unload fails ("failed to poll from model
            # repository"), so its cold start is the time ``bind`` takes instead.
            cold_start_via_repository=False,
            timings_file=WORK / "pytriton-timings.json",
        ),
    }


def missing_reason(name: str) -> str | None:
    """Why a peer cannot run here (its venv is missing), or ``None``."""
    if name == "mlserver" and not (HERE / ".venvs" / "mlserver" / "bin" / "mlserver").is_file():
        return "bench/peers/.venvs/mlserver missing: run bench/peers/setup_mlserver.sh"
    if name == "pytriton" and not venv_python("pytriton").is_file():
        return "bench/peers/.venvs/pytriton missing: run bench/peers/setup_pytriton.sh"
    return None


def run_bench(
    args: argparse.Namespace,
    spec: ServerSpec,
    models: list[str],
    payloads: dict[str, Path],
    out: Path,
    log: Path,
) -> list[dict[str, Any]]:
    """One ``modelyard bench`` sweep against ``spec``; returns its result dicts."""
    command = [
        sys.executable,
        "-m",
        "modelyard.cli",
        "bench",
        "--url",
        spec.url,
        "--models",
        ",".join(models),
        "--mix",
        "uniform",
        "--concurrency",
        args.concurrency,
        "--duration",
        str(args.duration),
        "--warmup",
        str(args.warmup),
        "--engine",
        args.engine,
        "--seed",
        str(args.seed),
        "--json",
        str(out),
    ]
    for model, path in payloads.items():
        command += ["--payload", f"{model}={path}"]
    levels = len(args.concurrency.split(","))
    limit_s = levels * (args.duration + args.warmup) * 2 + 120
    with log.open("wb") as stream:
        done = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT, timeout=limit_s)
    if done.returncode != 0:
        raise ProbeError(f"modelyard bench against {spec.name} exited {done.returncode}; see {log}")
    results: list[dict[str, Any]] = json.loads(out.read_text())["results"]
    return results


class PeakSampler:
    """Samples a server's tree memory in the background; keeps the peak RSS."""

    def __init__(self, server: RunningServer, interval_s: float = 0.5) -> None:
        self._server = server
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.peak: MemorySample | None = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            sample = self._server.memory()
            if self.peak is None or sample.rss_bytes > self.peak.rss_bytes:
                self.peak = sample

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_one(
    args: argparse.Namespace,
    spec: ServerSpec,
    round_index: int,
    models: list[str],
    payloads: dict[str, Path],
    bodies: dict[str, bytes],
) -> dict[str, Any]:
    """Start ``spec``, measure it, stop it; returns the round's record."""
    tag = f"{spec.name}-r{round_index}"
    log = WORK / "logs" / f"{tag}.log"
    record: dict[str, Any] = {"round": round_index}
    print(f"[round {round_index}] {spec.name}: starting", file=sys.stderr, flush=True)
    if spec.timings_file is not None:
        spec.timings_file.unlink(missing_ok=True)
    with RunningServer(spec, log) as server, httpx.Client(base_url=spec.url, timeout=30) as client:
        record["startup_s"] = round(wait_ready(server, client, models, args.ready_timeout), 3)
        record["server_metadata"] = client.get("/v2").json()
        record["labels"] = {m: predicted_label(infer(client, m, bodies[m])) for m in models}
        record["memory_idle"] = server.memory().to_dict()
        print(
            f"[round {round_index}] {spec.name}: ready in {record['startup_s']} s; benchmarking",
            file=sys.stderr,
            flush=True,
        )
        with PeakSampler(server) as sampler:
            record["bench"] = run_bench(
                args,
                spec,
                models,
                payloads,
                WORK / "raw" / f"{tag}.json",
                WORK / "logs" / f"{tag}-bench.log",
            )
        time.sleep(args.settle)
        record["memory_steady"] = server.memory().to_dict()
        record["memory_peak"] = sampler.peak.to_dict() if sampler.peak else None
        if spec.timings_file is not None and spec.timings_file.is_file():
            record["bind_s"] = json.loads(spec.timings_file.read_text()).get("bind_s", {})
        model = args.cold_start_model
        if args.cold_start_repeats == 0:
            record["cold_start"] = {"model": model, "note": "skipped (--cold-start-repeats 0)"}
        elif spec.cold_start_via_repository:
            record["cold_start"] = cold_start(
                server, client, model, bodies[model], repeats=args.cold_start_repeats
            )
        else:
            record["cold_start"] = {
                "model": model,
                "median_s": None,
                "note": "repository load after unload is not supported by PyTriton; "
                "'bind' time (session + Triton load until READY) shown instead",
            }
    record["exit_log"] = str(log.relative_to(REPO_ROOT))
    return record


def versions(selected: list[str]) -> dict[str, Any]:
    """What was installed where, for the record."""
    found: dict[str, Any] = {
        "modelyard": package_versions(
            sys.executable, ["modelyard", "onnxruntime", "scikit-learn", "numpy", "uvloop"]
        )
    }
    if "mlserver" in selected:
        found["mlserver"] = package_versions(
            venv_python("mlserver"), ["mlserver", "mlserver-sklearn", "uvloop", "scikit-learn"]
        )
    if "pytriton" in selected:
        found["pytriton"] = package_versions(
            venv_python("pytriton"), ["nvidia-pytriton", "tritonclient", "onnxruntime", "numpy"]
        )
    try:
        found["git"] = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        found["git"] = None
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", default=",".join(ALL_SERVERS), help="%(default)s")
    parser.add_argument("--concurrency", default="1,8,50", help="levels (%(default)s)")
    parser.add_argument("--duration", type=float, default=15.0, help="s per level (%(default)s)")
    parser.add_argument("--warmup", type=float, default=2.0, help="s before each (%(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="%(default)s")
    parser.add_argument("--engine", choices=("python", "wrk"), default="python")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base-port", type=int, default=18600, help="%(default)s, +10, +20")
    parser.add_argument(
        "--modelyard-isolation",
        choices=("as-configured", "inline", "process"),
        default="as-configured",
        help="override every model's isolation in a copy of the workload YAML (%(default)s)",
    )
    parser.add_argument(
        "--mlserver-max-batch-size",
        type=int,
        default=0,
        help="MLServer adaptive batching (0: off, MLServer's default)",
    )
    parser.add_argument("--mlserver-max-batch-time-s", type=float, default=0.0)
    parser.add_argument("--cold-start-model", default="digits-svc")
    parser.add_argument("--cold-start-repeats", type=int, default=3)
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    parser.add_argument("--settle", type=float, default=1.0, help="s before memory is read")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(selected) - set(ALL_SERVERS)
    if unknown:
        print(f"run_peers: unknown servers {sorted(unknown)}", file=sys.stderr)
        return 2
    config, models, row = build_workload(args.modelyard_isolation)
    if args.cold_start_model not in models:
        print(f"run_peers: --cold-start-model must be one of {models}", file=sys.stderr)
        return 2
    payloads = write_payloads(WORK / "payloads", models, row)
    bodies = {m: p.read_bytes() for m, p in payloads.items()}
    specs = server_specs(args, config, models)
    skipped = {name: r for name in selected if (r := missing_reason(name)) is not None}
    active = [name for name in selected if name not in skipped]
    for name, reason in skipped.items():
        print(f"run_peers: skipping {name}: {reason}", file=sys.stderr)
    (WORK / "raw").mkdir(parents=True, exist_ok=True)

    servers: dict[str, dict[str, Any]] = {
        name: {"rounds": [], "cold_start_model": args.cold_start_model} for name in active
    }
    failures: dict[str, list[str]] = {}
    for round_index in range(1, args.rounds + 1):
        # Alternate the order so slow drift (thermal, other load) hits every server alike.
        order = active if round_index % 2 else list(reversed(active))
        for name in order:
            try:
                servers[name]["rounds"].append(
                    run_one(args, specs[name], round_index, models, payloads, bodies)
                )
            except (ProbeError, RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as exc:
                message = f"round {round_index}: {exc}"
                print(f"run_peers: {name} failed: {message}", file=sys.stderr)
                failures.setdefault(name, []).append(message)

    labels = {
        name: record["rounds"][0]["labels"] for name, record in servers.items() if record["rounds"]
    }
    agree = len({json.dumps(v, sort_keys=True) for v in labels.values()}) <= 1
    summary = summarise(servers)
    document = {
        "meta": {
            "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "workload": {"models": models, "config": str(config.relative_to(REPO_ROOT))},
            "request": "input FP32 [1,64] (digits row 0), identical bytes for every server",
            "machine": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "affinity": len(os.sched_getaffinity(0)),
            },
            "versions": versions(active),
            "labels_agree": agree,
            "labels": labels,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
        "skipped": skipped,
        "failures": failures,
        "servers": servers,
        "summary": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=2) + "\n")
    print(markdown(summary))
    if not agree:
        print(f"\nwarning: servers disagree on predicted labels: {labels}")
    for name, reason in skipped.items():
        print(f"\n{name}: skipped: {reason}")
    print(f"\nwrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
