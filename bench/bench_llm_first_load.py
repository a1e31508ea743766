"""A worker's first GGUF load against a later one: what a spare's llama.cpp warm-up saves.

Run from the repository root (the ``llm`` extra installed)::

    .venv/bin/python bench/bench_llm_first_load.py --forks 16

The script imports what the fork server imports for a repository with ``llama_cpp``
models (``preload_for(["llama_cpp"])``: llama-cpp-python, its backend started, jinja2's
lexer built), freezes its objects as the fork server does, and forks workers from
itself. Each worker does one of

* ``cold``: nothing before the model's load (a worker forked for the load, or a spare
  without a warm-up);
* ``warmed``: ``prewarm("llama_cpp")`` first (what a spare does while it idles: a
  one-layer model written in plain Python, loaded and freed);
* ``second``: another model of the same size loaded, asked once and freed first (what
  any warm-up could at best achieve),

then loads a 60 MB random-weight GGUF model through the worker's own runtime
(``LlamaCppRuntime.load``: the file mapped, the context, the chat template, one decoded
token) and serves one request (a prompt, 4 greedy tokens). Reported per variant,
medians over the forks (variants interleaved, order rotated): the load's wall and CPU
time (every thread) and its page faults, the two calls in it that change
(``llama_model_load_from_file``, the chat template's compile), and the first request's
TTFT and CPU, and the worker's own memory (USS) before the load and after it. CPU time
and page faults are the steadier figures on a shared machine.

``--beside`` measures instead what a warm-up costs a request running beside it (a
refilled spare warms while the model that claimed the last one serves): a worker loads
the model and answers a first request, then a second one is timed (TTFT) alone, beside
a sibling worker that runs ``prewarm("llama_cpp")`` at the same moment, or beside one
that runs it in a thread at nice 19.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _server
import psutil

from modelyard.examples.gguf_llama import SHAPES, write_llama_gguf
from modelyard.workers.forkserver import preload_for

VARIANTS = ("cold", "warmed", "second")
MIB = 1024 * 1024
PROMPT = "Once upon a time there was a little model that wanted to write stories"


def _preload() -> None:
    """What the fork server does before it forks (``forkserver.main``)."""
    for name in preload_for(["llama_cpp"]):
        module_name, _, hook = name.partition(":")
        module = importlib.import_module(module_name)
        if hook:
            getattr(module, hook)()
    gc.collect()
    gc.freeze()


class _Sink:
    """Records when each job's first text and its end arrive."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.done: dict[int, threading.Event] = {1: threading.Event(), 2: threading.Event()}

    def chunk(
        self, seq: int, text: str, ids: list[int], finish: str | None, p: int, c: int
    ) -> None:
        if text:
            self.first.setdefault(seq, time.perf_counter())
        if finish is not None:
            self.done[seq].set()

    def failed(self, seq: int, code: str, message: str) -> None:
        raise RuntimeError(message)


def _timed(module: Any, name: str, into: dict[str, float]) -> None:
    """Wrap ``module.name`` so that its seconds add up in ``into[name]``."""
    inner: Callable[..., Any] = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            into[name] = into.get(name, 0.0) + time.perf_counter() - t0

    setattr(module, name, wrapper)


def _cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _load_and_ask(
    folder: Path, parts: dict[str, float] | None = None, *, keep: bool = False
) -> dict[str, float]:
    """Load the model in ``folder`` as a worker does, ask it once (then free it unless
    ``keep``); the figures."""
    from modelyard.runtimes.base import RuntimeSpec
    from modelyard.runtimes.generation import GenerationJob
    from modelyard.runtimes.llama_cpp import LlamaCppRuntime

    options = {"n_ctx": "512", "n_threads": "1"}
    runtime = LlamaCppRuntime()
    u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    runtime.load(RuntimeSpec("llama_cpp", str(folder), folder.parent.name, options=options))
    t1, u1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    sink = _Sink()
    runtime.start(sink)
    runtime.submit(GenerationJob(1, PROMPT, None, 4, 0.0, 1.0, 0, None, ()))
    if not sink.done[1].wait(30):
        raise TimeoutError("the request did not finish")
    u2 = resource.getrusage(resource.RUSAGE_SELF)
    if not keep:
        runtime.close()
    out = {
        "load_ms": (t1 - t0) * 1000,
        "load_cpu_ms": (_cpu_s(u1) - _cpu_s(u0)) * 1000,
        "load_faults": float(u1.ru_minflt - u0.ru_minflt),
        "ttft_ms": (sink.first[1] - t1) * 1000,
        "request_cpu_ms": (_cpu_s(u2) - _cpu_s(u1)) * 1000,
    }
    out.update({f"{k}_ms": v * 1000 for k, v in (parts or {}).items()})
    return out


def _worker(variant: str, models: dict[str, Path], write_fd: int) -> None:
    import llama_cpp

    import modelyard.runtimes.llama_cpp as runtime_module
    from modelyard.runtimes import prewarm

    t0 = time.perf_counter()
    if variant == "warmed":
        prewarm("llama_cpp")
    elif variant == "second":
        _load_and_ask(models["other"])
    warm_ms = (time.perf_counter() - t0) * 1000
    me = psutil.Process()
    uss_before = me.memory_full_info().uss
    parts: dict[str, float] = {}
    _timed(llama_cpp, "llama_model_load_from_file", parts)
    _timed(runtime_module, "compile_chat_template", parts)
    result = _load_and_ask(models["target"], parts, keep=True) | {"before_ms": warm_ms}
    result["own_mib_before"] = uss_before / MIB  # an idle spare's own (private) memory
    result["own_mib_loaded"] = me.memory_full_info().uss / MIB  # what the budget measures
    os.write(write_fd, json.dumps(result).encode())


def _fork(
    variant: str, models: dict[str, Path], body: Callable[[str, dict[str, Path], int], None]
) -> dict[str, float]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(read_fd)
        code = 0
        try:
            body(variant, models, write_fd)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(write_fd)
    data = b""
    while chunk := os.read(read_fd, 65536):
        data += chunk
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the {variant} worker failed")
    result: dict[str, float] = json.loads(data)
    return result


def _warm_beside(go: int, how: str) -> None:
    """A sibling worker: wait for the signal, then warm llama.cpp (``how``)."""
    from modelyard.runtimes import prewarm

    os.read(go, 1)
    if how == "nice19":

        def run() -> None:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            prewarm("llama_cpp")

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    else:
        prewarm("llama_cpp")
    os._exit(0)


def _ask_beside(how: str, models: dict[str, Path], write_fd: int) -> None:
    from modelyard.runtimes.base import RuntimeSpec
    from modelyard.runtimes.generation import GenerationJob
    from modelyard.runtimes.llama_cpp import LlamaCppRuntime

    runtime = LlamaCppRuntime()
    folder = models["target"]
    options = {"n_ctx": "512", "n_threads": "1"}
    runtime.load(RuntimeSpec("llama_cpp", str(folder), "target", options=options))
    sink = _Sink()
    runtime.start(sink)
    runtime.submit(GenerationJob(1, PROMPT, None, 2, 0.0, 1.0, 0, None, ()))
    sink.done[1].wait(30)
    go_read, go_write = os.pipe()
    sibling = os.fork() if how != "alone" else 0
    if how != "alone" and sibling == 0:
        _warm_beside(go_read, how)
    if sibling:
        os.write(go_write, b"x")
    t0 = time.perf_counter()
    runtime.submit(GenerationJob(2, f"2. {PROMPT}", None, 2, 0.0, 1.0, 0, None, ()))
    sink.done[2].wait(30)
    ttft_ms = (sink.first[2] - t0) * 1000
    if sibling:
        os.waitpid(sibling, 0)
    os.write(write_fd, json.dumps({"ttft_ms": ttft_ms}).encode())


def main() -> None:
    """Write the models, preload, fork the workers; print and save the medians."""
    parser = _server.arg_parser(__doc__)
    parser.add_argument("--forks", type=int, default=16, help="workers per variant")
    parser.add_argument("--beside", action="store_true", help="a request beside a warm-up")
    args = parser.parse_args()
    variants = ("alone", "nice0", "nice19") if args.beside else VARIANTS
    body = _ask_beside if args.beside else _worker
    with tempfile.TemporaryDirectory(prefix="bench-llm-first-") as tmp:
        models = {
            name: write_llama_gguf(Path(tmp) / name / "1" / "model.gguf", SHAPES["small"], i).parent
            for i, name in enumerate(("target", "other"), start=11)
        }
        _preload()
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for i in range(args.forks):
            for variant in variants[i % 3 :] + variants[: i % 3]:
                runs[variant].append(_fork(variant, models, body))
    keys = list(runs[variants[0]][0])
    medians = {v: {k: statistics.median(r[k] for r in rs) for k in keys} for v, rs in runs.items()}
    payload = {"environment": _server.environment(), "args": vars(args), "medians": medians}
    path = _server.write_results("llm_beside_warm" if args.beside else "llm_first_load", payload)
    rows = [[k, *(f"{medians[v][k]:.1f}" for v in variants)] for k in keys]
    print(_server.markdown_table(["median", *variants], rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
