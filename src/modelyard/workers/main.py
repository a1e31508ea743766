"""The loop that runs inside a worker process: load one model, then serve batches.

A worker is either forked by the fork server (``forkserver.py``) or, cold, started as
``python -m modelyard.workers.main --channel-fd N --region-fd M``. Either way it gets
two file descriptors: its end of the control socket and the shared tensor region.
It sends :class:`Hello`, waits for :class:`Load`, answers :class:`Loaded` or
:class:`Failed`, then answers each :class:`Infer` with :class:`InferDone` or
:class:`Failed` until :class:`Stop` or end of stream. Errors travel as
:class:`ErrorInfo` data, never as pickled exceptions.

This module never imports the server's manager, scheduler or front ends.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

import msgspec

from modelyard.errors import ErrorCode, InternalError, ServerError
from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes import (
    GENERATIVE_KINDS,
    GenerativeRuntime,
    Runtime,
    create_generative_runtime,
    create_runtime,
    prewarm,
)
from modelyard.runtimes.errors import classify_runtime_error
from modelyard.runtimes.warmup import make_warmup_inputs
from modelyard.workers.adapter_contexts import AdapterContexts
from modelyard.workers.channel import BlockingChannel, ChannelClosedError, SharedRegion
from modelyard.workers.device import enter_device
from modelyard.workers.footprint import sample_memory
from modelyard.workers.huge_pages import advise_huge_pages, trim_heap
from modelyard.workers.messages import (
    AdapterAttached,
    AdapterDetached,
    AttachAdapter,
    Cancel,
    Chunk,
    DetachAdapter,
    ErrorInfo,
    Failed,
    Generate,
    GenerationCounters,
    Hello,
    Infer,
    InferDone,
    Load,
    Loaded,
    Released,
    StatsQuery,
    Stop,
    Warm,
)
from modelyard.workers.release import close_and_measure

_PR_SET_PDEATHSIG = 1
_MIB = 1024 * 1024


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent exits (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _error_info(err: ServerError) -> ErrorInfo:
    return ErrorInfo(err.code.value, err.message, traceback.format_exc())


def _infer_error(exc: BaseException, limit_bytes: int | None) -> ErrorInfo:
    if isinstance(exc, MemoryError):
        limit = f"its memory limit of {limit_bytes // _MIB} MiB" if limit_bytes else "memory"
        err: ServerError = InternalError(f"inference failed: the model ran out of {limit}")
    else:
        err = classify_runtime_error(exc)
    return _error_info(err)


def _load(runtime: Runtime, msg: Load, warmed: tuple[str, ...]) -> Loaded:
    t0 = time.perf_counter()
    runtime.load(msg.spec)
    advise_huge_pages(Path(msg.spec.version_dir), msg.spec.huge_pages_min_bytes)
    return Loaded(
        msg.seq,
        tuple(runtime.inputs),
        tuple(runtime.outputs),
        runtime.supports_batching,
        time.perf_counter() - t0,
        warmed=warmed,
    )


def _warm_up_and_measure(runtime: Runtime, msg: Load, loaded: Loaded) -> Loaded | Failed:
    """What ``Load.warm_up`` and ``Load.measure`` ask for, in the reply: the server is
    spared a round trip (Infer) and a thread hop (its read of this process's memory)."""
    warmup_s = -1.0
    if msg.warm_up:
        t0 = time.perf_counter()
        try:
            runtime.infer(make_warmup_inputs(runtime.inputs))
        except Exception as exc:
            err = classify_runtime_error(exc)
            message = f"model {msg.spec.model_name!r} failed its warm-up: {err.message}"
            info = ErrorInfo(ErrorCode.MODEL_LOAD_FAILED.value, message, traceback.format_exc())
            return Failed(msg.seq, info)
        warmup_s = time.perf_counter() - t0
    loaded = msgspec.structs.replace(loaded, warmup_s=warmup_s)
    if not msg.measure:
        return loaded
    sample = sample_memory(os.getpid())
    return msgspec.structs.replace(
        loaded,
        rss_bytes=sample.rss_bytes,
        uss_bytes=sample.uss_bytes,
        pss_bytes=sample.pss_bytes,
        swap_bytes=sample.swap_bytes,
    )


def serve(channel_fd: int, region_fd: int, region_bytes: int) -> int:
    """Run the worker on the two descriptors; the return value is the exit code."""
    faulthandler.enable()
    channel = BlockingChannel(socket.socket(fileno=channel_fd))
    region = SharedRegion(region_fd, region_bytes)
    try:
        channel.send(Hello(os.getpid()))
        return _serve(channel, region)
    except ChannelClosedError:
        return 0
    finally:
        channel.close()


def _warm(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Start runtimes ahead in a spare (:class:`Warm`); those that started. A failure
    costs only the head start: the model's own load meets the same error and reports it."""
    started = []
    for kind in kinds:
        try:
            if prewarm(kind):
                started.append(kind)
        except Exception as exc:
            print(f"modelyard worker: could not warm {kind}: {exc!r}", file=sys.stderr)
    return tuple(started)


def _serve(channel: BlockingChannel, region: SharedRegion) -> int:
    first = channel.recv()
    warmed: tuple[str, ...] = ()
    while isinstance(first, Warm):
        warmed += _warm(first.kinds)
        trim_heap()  # a spare lives on, idle, until a load claims it
        first = channel.recv()
    if not isinstance(first, Load):
        return 0 if first is None or isinstance(first, Stop) else 2
    if first.spec.kind in GENERATIVE_KINDS:
        return _serve_generation(channel, first, warmed)
    try:
        first = msgspec.structs.replace(first, spec=enter_device(first.spec))
        runtime = create_runtime(first.spec.kind)
        loaded = _load(runtime, first, warmed)
    except Exception as exc:
        message = f"model {first.spec.model_name!r} failed to load: {type(exc).__name__}: {exc}"
        info = ErrorInfo(ErrorCode.MODEL_LOAD_FAILED.value, message, traceback.format_exc())
        channel.send(Failed(first.seq, info))
        return 1
    reply = _warm_up_and_measure(runtime, first, loaded)
    channel.send(reply)
    if isinstance(reply, Failed):
        return 1
    limit = first.memory_limit_bytes
    recv, send, infer = channel.recv, channel.send, runtime.infer
    while True:
        msg = recv()
        if type(msg) is not Infer:  # the common message first, by one type test
            if msg is None or isinstance(msg, Stop):
                runtime.close()
                return 0
            continue
        tensors = msg.tensors
        region.remap(msg.region_bytes)
        try:
            inputs = region.read(tensors, copy=False)
            outputs = infer(inputs)
            del inputs
            metas = region.write_after(outputs, tensors)
        except Exception as exc:
            send(Failed(msg.seq, _infer_error(exc, limit)))
            continue
        send(InferDone(msg.seq, region.size, metas))


class _ChannelSink:
    """Sends what the generation thread produces, at once; sends are serialised because
    the main thread answers StatsQuery on the same socket."""

    def __init__(self, channel: BlockingChannel) -> None:
        self._channel = channel
        self._lock = threading.Lock()

    def send(
        self,
        msg: Chunk
        | Failed
        | GenerationCounters
        | Loaded
        | Released
        | AdapterAttached
        | AdapterDetached,
    ) -> None:
        # A send error means the server went away: the main loop sees the end of stream.
        with self._lock, contextlib.suppress(ChannelClosedError, OSError):
            self._channel.send(msg)

    def chunk(
        self,
        seq: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        self.send(
            Chunk(
                seq,
                text,
                tuple(token_ids),
                finish_reason,
                prompt_tokens,
                completion_tokens,
                logprobs,
            )
        )

    def failed(self, seq: int, code: str, message: str) -> None:
        self.send(Failed(seq, ErrorInfo(code, message)))


def _serve_generation(channel: BlockingChannel, first: Load, warmed: tuple[str, ...]) -> int:
    """Serve a generative model: jobs go to the runtime's generation thread, which sends
    their chunks itself; this loop only receives (jobs, cancellations, stats queries)."""
    try:
        # Its core set or GPU first, as for a tensor model: a llama.cpp build with CUDA
        # would otherwise split the layers over every GPU the host has.
        first = msgspec.structs.replace(first, spec=enter_device(first.spec))
        runtime: GenerativeRuntime = create_generative_runtime(first.spec.kind)
        t0 = time.perf_counter()
        runtime.load(first.spec)
        advise_huge_pages(Path(first.spec.version_dir), first.spec.huge_pages_min_bytes)
        t1 = time.perf_counter()
        load_s, warmup_s = t1 - t0, 0.0
        if first.warm_up:  # else the prompt of the request waiting for it comes first
            runtime.warm_up()
            warmup_s = time.perf_counter() - t1
    except Exception as exc:
        message = f"model {first.spec.model_name!r} failed to load: {type(exc).__name__}: {exc}"
        info = ErrorInfo(ErrorCode.MODEL_LOAD_FAILED.value, message, traceback.format_exc())
        channel.send(Failed(first.seq, info))
        return 1
    sink = _ChannelSink(channel)
    st = runtime.stats()
    sink.send(
        Loaded(
            first.seq,
            (),
            (),
            False,
            load_s,
            st.context_length,
            st.parallel,
            st.kv_cache_bytes,
            warmup_s=warmup_s,
            warmed=warmed,
        )
    )
    runtime.start(sink)
    adapters = AdapterContexts(runtime, sink)
    try:
        while True:
            msg = channel.recv()
            if msg is None:
                return 0
            if isinstance(msg, Stop):
                # What closing frees is the system's again before the slow exit: say so.
                unmaps = first.spec.kind == "llama_cpp"  # its GGUF file, always mapped
                adapters.close_all()
                sink.send(close_and_measure(runtime.close, unmaps=unmaps))
                return 0
            _generation_message(msg, adapters, sink)
    finally:
        adapters.close_all()
        runtime.close()


def _generation_message(msg: object, adapters: AdapterContexts, sink: _ChannelSink) -> None:
    """Act on one message to a serving generative worker (not Stop)."""
    if isinstance(msg, Generate):
        target = adapters.runtime(msg.adapter)
        if target is None:  # detached meanwhile: the server's stream gets the reason
            sink.failed(msg.job.seq, ErrorCode.MODEL_NOT_READY.value, _gone(msg.adapter))
        else:
            target.submit(msg.job)
    elif isinstance(msg, Cancel):
        adapters.cancel(msg.seq)
    elif isinstance(msg, StatsQuery):
        target = adapters.runtime(msg.adapter)
        if target is None:
            sink.failed(msg.seq, ErrorCode.MODEL_NOT_READY.value, _gone(msg.adapter))
        else:
            sink.send(GenerationCounters(msg.seq, target.stats()))
    elif isinstance(msg, AttachAdapter):
        sink.send(adapters.attach(msg))
        adapters.start_attached()
    elif isinstance(msg, DetachAdapter):
        sink.send(adapters.detach(msg))


def _gone(adapter: str) -> str:
    return f"the adapter {adapter!r} is not attached to this worker (unloaded)"


def main(argv: list[str] | None = None) -> None:
    """Entry point of a cold-started worker."""
    parser = argparse.ArgumentParser(prog="modelyard-worker")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--region-fd", type=int, required=True)
    parser.add_argument("--region-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = serve(args.channel_fd, args.region_fd, args.region_bytes)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: runtimes' static destructors (thread pools) are not
    # worth running in a process that is going away.
    os._exit(code)


if __name__ == "__main__":
    main()
