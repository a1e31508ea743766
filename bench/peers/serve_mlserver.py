"""Serve the five digits classifiers on Seldon MLServer's scikit-learn runtime.

Run it with the *modelyard* venv: it trains the models with modelyard's own
``train_digits_classifier`` (the same estimators the ONNX workload is exported from), pickles
them with joblib, writes an MLServer repository, then replaces itself (``exec``) with
``mlserver start`` from the MLServer venv that ``setup_mlserver.sh`` built. The process id
stays the same, so whoever started this script can watch and stop the server by it.

    .venv/bin/python bench/peers/serve_mlserver.py --http-port 9080
    .venv/bin/python bench/peers/serve_mlserver.py --prepare-only     # just write the folder

Repository layout (``--work``, default ``bench/peers/scratch/mlserver``)::

    settings.json                       server: ports, host, debug off
    digits-logreg/model-settings.json   implementation mlserver_sklearn.SKLearnModel
    digits-logreg/model.joblib          parameters.uri points here
    ...

Everything server-wide is MLServer's default (notably ``parallel_workers`` = 1: inference
runs in one worker process beside the server process) except ``debug``, which is off:
MLServer's default ``debug: true`` writes an access-log line per request, which modelyard
does not do. Adaptive batching is off unless ``--max-batch-size`` is given (MLServer's default).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_WORK = HERE / "scratch" / "mlserver"
DEFAULT_VENV = HERE / ".venvs" / "mlserver"
MODEL_FILE = "model.joblib"
STAMP_FILE = "trained-with.json"


def _sklearn_version(venv: Path) -> str | None:
    """scikit-learn version inside ``venv`` (read from its dist-info, no import)."""
    for dist in (venv / "lib").glob("python3*/site-packages/scikit_learn-*.dist-info"):
        return dist.name.removeprefix("scikit_learn-").removesuffix(".dist-info")
    return None


def prepare(work: Path, *, max_batch_size: int, max_batch_time_s: float) -> list[str]:
    """Train and pickle the five classifiers (once) and (re)write every settings file."""
    import joblib
    import sklearn

    from modelyard.examples.sklearn_models import DIGITS_CLASSIFIERS, train_digits_classifier

    work.mkdir(parents=True, exist_ok=True)
    stamp = work / STAMP_FILE
    if stamp.is_file() and json.loads(stamp.read_text()).get("scikit-learn") != sklearn.__version__:
        # Pickles from another scikit-learn may not load (or may load wrong): make them again.
        for pickle in work.glob(f"*/{MODEL_FILE}"):
            pickle.unlink()
    names = []
    for kind in DIGITS_CLASSIFIERS:
        name = f"digits-{kind}"
        folder = work / name
        folder.mkdir(exist_ok=True)
        target = folder / MODEL_FILE
        if not target.is_file():
            tmp = folder / f".{MODEL_FILE}.tmp"
            joblib.dump(train_digits_classifier(kind), tmp)
            os.replace(tmp, target)
        settings: dict[str, object] = {
            "name": name,
            "implementation": "mlserver_sklearn.SKLearnModel",
            "parameters": {"uri": f"./{MODEL_FILE}", "version": "1"},
        }
        if max_batch_size > 0:
            settings["max_batch_size"] = max_batch_size
            settings["max_batch_time"] = max_batch_time_s
        (folder / "model-settings.json").write_text(json.dumps(settings, indent=2) + "\n")
        names.append(name)
    stamp.write_text(json.dumps({"scikit-learn": sklearn.__version__}) + "\n")
    return names


def write_server_settings(
    work: Path, *, host: str, http_port: int, grpc_port: int, metrics_port: int, debug: bool
) -> None:
    """``settings.json``: ports and host; ``parallel_workers`` left at MLServer's default."""
    settings = {
        "host": host,
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": metrics_port,
        "debug": debug,
    }
    (work / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="repository folder")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="MLServer venv")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=9080)
    parser.add_argument("--grpc-port", type=int, default=9081)
    parser.add_argument("--metrics-port", type=int, default=9082)
    parser.add_argument(
        "--max-batch-size", type=int, default=0, help="adaptive batching (0: off, the default)"
    )
    parser.add_argument("--max-batch-time-s", type=float, default=0.0)
    parser.add_argument("--debug", action="store_true", help="MLServer debug (access logs)")
    parser.add_argument("--prepare-only", action="store_true", help="write the folder and exit")
    parser.add_argument("--retrain", action="store_true", help="retrain even if pickles exist")
    args = parser.parse_args(argv)

    work = args.work.resolve()
    if args.retrain:
        for pickle in work.glob(f"*/{MODEL_FILE}"):
            pickle.unlink()
    names = prepare(
        work, max_batch_size=args.max_batch_size, max_batch_time_s=args.max_batch_time_s
    )
    write_server_settings(
        work,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        debug=args.debug,
    )
    import sklearn

    peer_sklearn = _sklearn_version(args.venv)
    if peer_sklearn is not None and peer_sklearn != sklearn.__version__:
        print(
            f"serve_mlserver: warning: pickles made with scikit-learn {sklearn.__version__}, "
            f"MLServer venv has {peer_sklearn}; re-run setup_mlserver.sh with "
            f'SKLEARN_SPEC="scikit-learn=={sklearn.__version__}"',
            file=sys.stderr,
        )
    print(f"serve_mlserver: {len(names)} models in {work}", file=sys.stderr, flush=True)
    if args.prepare_only:
        return 0
    mlserver = args.venv / "bin" / "mlserver"
    if not mlserver.is_file():
        print(f"serve_mlserver: {mlserver} missing; run setup_mlserver.sh", file=sys.stderr)
        return 1
    # NOTE: exec, not a child process: the caller's pid becomes the MLServer parent process,
    # so its process tree (server + inference worker) is exactly what gets measured.
    os.execv(mlserver, [str(mlserver), "start", str(work)])
    return 1  # not reached: execv replaces this process or raises OSError


if __name__ == "__main__":
    sys.exit(main())
