"""Serve the five digits classifiers on NVIDIA PyTriton (Triton Inference Server + Python).

Run it with the PyTriton venv that ``setup_pytriton.sh`` built. It reads the ONNX files the
modelyard digits workload wrote (``<repo>/digits-<kind>/1/model.onnx``) and binds each one to
Triton as a Python inference function that runs ONNX Runtime on the CPU, so every server in
the comparison runs the same graphs:

    bench/peers/.venvs/pytriton/bin/python bench/peers/serve_pytriton.py \\
        --repo <workload folder> --http-port 9180 --grpc-port 9181 --metrics-port 9182

Settings mirror the workload's ``modelyard.yaml``: dynamic batching up to 8 with no queue
delay (``max_batch_size: 8``, ``max_queue_delay_us: 0``), one model instance and one
intra-op thread per ONNX Runtime session (``intra_op_threads: 1``). Per-sample shapes exclude
the batch dimension, so a request ``input`` FP32 ``[1, 64]`` answers ``label`` INT64 ``[1, 1]``
(Triton has no scalar per-sample shape) and ``probabilities`` FP32 ``[1, 10]``.

The model-repository API (``/v2/repository/models/{m}/load|unload``) is restricted by PyTriton
to callers that send header ``triton-access-token``; pass the token in ``$PYTRITON_ACCESS_TOKEN``.

Triton runs as a child process (``tritonserver``) with one Python-backend stub per model;
the ONNX sessions run in this process. Stop it with SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

DIGITS_MODELS = (
    "digits-logreg",
    "digits-random-forest",
    "digits-mlp",
    "digits-svc",
    "digits-gradient-boosting",
)
MAX_BATCH_SIZE = 8


def use_own_libpython() -> str | None:
    """Make Triton's Python-backend stubs embed *this* interpreter's libpython.

    The stub binary links ``libpython3.X.so.1.0`` by soname and the loader finds the system's
    copy first (Debian 12: 3.11.2), while ``sys.path`` comes from this venv's interpreter. When
    the two differ (e.g. a pyenv 3.11.7), the stub dies at model load with ``AttributeError:
    '_thread.RLock' object has no attribute '_recursion_count'``. ``LD_LIBRARY_PATH`` wins over
    the system paths (the stub's RPATH names only PyTriton's own lib folder), and the
    ``tritonserver`` child inherits it. Returns the folder put first, or ``None``.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME")
    if not libdir or not soname or not (Path(libdir) / soname).is_file():
        return None
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir not in current.split(os.pathsep):
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, current) if p)
    return str(libdir)


def make_infer(path: Path, intra_op_threads: int) -> Any:
    """A ``@batch`` inference function over one ONNX session (``input`` → label, probabilities)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    @batch
    def infer(input: np.ndarray) -> dict[str, np.ndarray]:  # @batch passes tensors by name
        label, probabilities = session.run(["label", "probabilities"], {"input": input})
        return {
            "label": np.asarray(label, dtype=np.int64).reshape(-1, 1),
            "probabilities": np.asarray(probabilities, dtype=np.float32),
        }

    return infer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="digits workload folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=9180)
    parser.add_argument("--grpc-port", type=int, default=9181)
    parser.add_argument("--metrics-port", type=int, default=9182)
    parser.add_argument(
        "--models",
        default=",".join(DIGITS_MODELS),
        help="comma-separated model folders under --repo (default: the five digits models)",
    )
    parser.add_argument("--max-batch-size", type=int, default=MAX_BATCH_SIZE)
    parser.add_argument("--max-queue-delay-us", type=int, default=0)
    parser.add_argument("--intra-op-threads", type=int, default=1)
    parser.add_argument("--log-verbose", type=int, default=0, help="Triton log verbosity")
    parser.add_argument(
        "--timings",
        type=Path,
        help="write {'bind_s': {model: seconds}} here once every model is bound",
    )
    parser.add_argument(
        "--access-token-env",
        default="PYTRITON_ACCESS_TOKEN",
        help=(
            "environment variable holding the token for Triton's restricted APIs (model "
            "repository, statistics...; header 'triton-access-token'); unset: PyTriton makes "
            "a random one (%(default)s)"
        ),
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    libdir = use_own_libpython()
    if libdir is not None:
        print(f"serve_pytriton: stubs embed libpython from {libdir}", file=sys.stderr)

    config = TritonConfig(
        http_address=args.host,
        http_port=args.http_port,
        grpc_address=args.host,
        grpc_port=args.grpc_port,
        metrics_address=args.host,
        metrics_port=args.metrics_port,
        log_verbose=args.log_verbose,
    )
    # SIGTERM → the same clean shutdown as Ctrl-C: Triton's child process and stubs go too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    security = TritonSecurityConfig(access_token=os.environ.get(args.access_token_env) or None)
    bind_s: dict[str, float] = {}
    with Triton(config=config, security_config=security) as triton:
        for name in filter(None, (m.strip() for m in args.models.split(","))):
            path = args.repo / name / "1" / "model.onnx"
            if not path.is_file():
                print(f"serve_pytriton: {path} missing; build the workload first", file=sys.stderr)
                return 1
            # Session creation + bind: Triton loads the model and starts its stub; bind
            # returns once the model is READY. This is PyTriton's "cold start" of a model.
            started = time.monotonic()
            triton.bind(
                model_name=name,
                infer_func=make_infer(path, args.intra_op_threads),
                inputs=[Tensor(name="input", dtype=np.float32, shape=(64,))],
                outputs=[
                    Tensor(name="label", dtype=np.int64, shape=(1,)),
                    Tensor(name="probabilities", dtype=np.float32, shape=(10,)),
                ],
                config=ModelConfig(
                    max_batch_size=args.max_batch_size,
                    batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
                ),
                strict=True,
            )
            bind_s[name] = round(time.monotonic() - started, 4)
        if args.timings is not None:
            args.timings.write_text(json.dumps({"bind_s": bind_s}, indent=2) + "\n")
        # SIGINT/SIGTERM end serve() with KeyboardInterrupt; leaving the block stops Triton.
        with contextlib.suppress(KeyboardInterrupt):
            triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
