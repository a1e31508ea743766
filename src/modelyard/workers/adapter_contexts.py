"""The LoRA adapters a generative worker serves over its own model (worker side).

A ``llama_cpp`` worker loads its base model once; each adapter the server attaches
(:class:`~modelyard.workers.messages.AttachAdapter`) becomes a runtime of its own over
that same loaded model (``LlamaCppRuntime.attach_adapter``): the adapter's tensors, a
context with it applied and a generation thread, but no second mapping of the weights
and no second process. Jobs name their adapter (``Generate.adapter``); the base's own
jobs name none and run without any.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path
from typing import Protocol, runtime_checkable

from modelyard.errors import ErrorCode
from modelyard.runtimes.base import RuntimeSpec, find_model_file
from modelyard.runtimes.generation import GenerationSink, GenerativeRuntime
from modelyard.workers.huge_pages import trim_heap
from modelyard.workers.messages import (
    AdapterAttached,
    AdapterDetached,
    AttachAdapter,
    DetachAdapter,
    ErrorInfo,
    Failed,
)
from modelyard.workers.release import DRIFT_BYTES, resident_anon_bytes

_log = logging.getLogger(__name__)


@runtime_checkable
class AdapterHost(Protocol):
    """A generative runtime that can serve LoRA adapters over its loaded model."""

    def attach_adapter(self, spec: RuntimeSpec) -> GenerativeRuntime:
        """A runtime for the adapter in ``spec``'s folder, over this one's model
        (ValueError when the adapter does not fit the model)."""
        ...

    def refill_spare(self) -> None:
        """Make ahead the context the next adapter takes (if this model keeps one)."""
        ...


class AdapterContexts:
    """The adapters attached to one worker's model, by name; ``""`` is the model itself."""

    def __init__(self, base: GenerativeRuntime, sink: GenerationSink) -> None:
        self._base = base
        self._sink = sink
        self._adapters: dict[str, GenerativeRuntime] = {}
        self._unstarted: GenerativeRuntime | None = None

    def runtime(self, name: str) -> GenerativeRuntime | None:
        """The runtime that serves ``name`` (``""``: the model itself); None if unknown."""
        return self._base if not name else self._adapters.get(name)

    def cancel(self, seq: int) -> None:
        """Stop job ``seq`` wherever it runs (sequence numbers are the worker's, unique)."""
        self._base.cancel(seq)
        for runtime in self._adapters.values():
            runtime.cancel(seq)

    def attach(self, msg: AttachAdapter) -> AdapterAttached | Failed:
        """Attach the adapter ``msg`` names (replacing one of the same name); Failed with
        the reason when the model cannot take it, the model serving on as before."""
        name = msg.spec.model_name
        if not isinstance(self._base, AdapterHost):
            return _failed(msg.seq, f"adapter {name!r}: this model's runtime takes no adapters")
        self.detach(DetachAdapter(msg.seq, name))
        before = resident_anon_bytes()
        t0 = time.perf_counter()
        try:
            runtime = self._base.attach_adapter(msg.spec)
        except Exception as exc:
            return _failed(msg.seq, f"adapter {name!r} failed to load: {exc}")
        try:
            if msg.warm_up:
                runtime.warm_up()
        except Exception as exc:
            runtime.close()
            return _failed(msg.seq, f"adapter {name!r} failed its warm-up: {exc}")
        load_s = time.perf_counter() - t0
        grown = max(0, resident_anon_bytes() - before)
        # Its thread starts after the reply (:meth:`start_attached`), as a worker's own
        # model's does: jobs sent meanwhile wait in its inbox.
        self._adapters[name] = self._unstarted = runtime
        st = runtime.stats()
        # The heap may have reused memory a detached adapter freed: the growth is then
        # less than what the adapter holds, never less than its tensors and KV cache.
        held = max(grown, _file_bytes(msg.spec) + st.kv_cache_bytes)
        return AdapterAttached(
            msg.seq, load_s, st.context_length, st.parallel, st.kv_cache_bytes, held
        )

    def start_attached(self) -> None:
        """Start the generation thread of the adapter attached last, then make the next
        adapter's context ahead (both after the attach's reply: off the switch's path)."""
        runtime, self._unstarted = self._unstarted, None
        if runtime is not None:
            runtime.start(self._sink)
        if isinstance(self._base, AdapterHost):
            try:
                self._base.refill_spare()
            except Exception:  # the next adapter makes its own context, as without one
                _log.warning("could not make a spare context ahead", exc_info=True)

    def detach(self, msg: DetachAdapter) -> AdapterDetached:
        """Close the adapter's runtime (its jobs end) and free its tensors and context."""
        runtime = self._adapters.pop(msg.name, None)
        if runtime is None:
            return AdapterDetached(msg.seq, 0)
        if runtime is self._unstarted:
            self._unstarted = None
        before = resident_anon_bytes()
        runtime.close()
        trim_heap()  # the freed buffers go back to the system, not to the heap's free lists
        return AdapterDetached(msg.seq, max(0, before - resident_anon_bytes() - DRIFT_BYTES))

    def close_all(self) -> None:
        """Close every adapter's runtime (before the model they share is freed)."""
        for name in list(self._adapters):
            self.detach(DetachAdapter(0, name))


def _file_bytes(spec: RuntimeSpec) -> int:
    """The size of the adapter's file (its tensors are read into memory)."""
    try:
        return find_model_file(Path(spec.version_dir), (".gguf",), spec.model_file).stat().st_size
    except (OSError, ValueError):
        return 0


def _failed(seq: int, message: str) -> Failed:
    info = ErrorInfo(ErrorCode.MODEL_LOAD_FAILED.value, message, traceback.format_exc())
    return Failed(seq, info)
