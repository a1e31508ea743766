"""ModelActor: the body of one model replica running as a Ray actor on some node.

``ray_instance.py`` wraps this class with ``ray.remote`` (so this module needs no Ray
import and runs as plain Python in tests). The actor verifies the version's manifest on
the node that loads it (every node must see the repository at the same path), loads and
warms the runtime, and serves calls one at a time. Errors come back as data
(``ErrorInfo``) and the ingress rebuilds the typed error, as with process workers.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback

import numpy as np
import psutil

from modelyard.errors import ErrorCode, ModelLoadError, ServerError
from modelyard.runtimes import Runtime, create_runtime
from modelyard.runtimes.base import RuntimeSpec, TensorSpec
from modelyard.runtimes.errors import classify_runtime_error
from modelyard.runtimes.warmup import make_warmup_inputs
from modelyard.workers.cluster_nodes import local_device
from modelyard.workers.messages import ErrorInfo
from modelyard.workers.ray_files import NodeFiles, version_files

__all__ = ["ActorLoaded", "ActorReply", "ModelActor"]


@dataclasses.dataclass(frozen=True, slots=True)
class ActorLoaded:
    """What a loaded actor reports back."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    supports_batching: bool
    load_s: float
    warmup_s: float
    footprint_bytes: int
    """The actor process's USS after warm-up (as for a worker process)."""
    pid: int
    verified: bool
    """True when a manifest was checked on this node."""
    store_fetch: str = ""
    """``fetched`` or ``cached`` from ``ray.model_store``; empty: the server's path."""


ActorReply = tuple[dict[str, np.ndarray] | None, ErrorInfo | None]
"""``(outputs, None)`` or ``(None, error)``: errors travel as data, never as pickles of
exception objects the ingress would have to trust."""


def _error(exc: BaseException) -> ErrorInfo:
    err = exc if isinstance(exc, ServerError) else classify_runtime_error(exc)
    return ErrorInfo(err.code.value, err.message, traceback.format_exc(limit=8))


class ModelActor:
    """One loaded model version on one node; calls run one at a time, in order."""

    def __init__(self) -> None:
        self._runtime: Runtime | None = None
        self._leases: set[str] = set()

    def warm(self) -> int:
        """Start what a load would (ONNX Runtime's process-wide state) in an idle spare
        actor, before any load claims it; returns its pid."""
        from modelyard.runtimes import prewarm

        prewarm("onnx")
        return os.getpid()

    def load(
        self,
        spec: RuntimeSpec,
        warmup: dict[str, np.ndarray] | None,
        public_keys: list[str],
        require_manifest: bool,
        files: NodeFiles | None = None,
    ) -> tuple[ActorLoaded | None, ErrorInfo | None]:
        """Verify, load and warm up ``spec`` here (its files fetched from the model
        store first when ``files`` names one); ``(None, error)`` on failure."""
        if self._runtime is not None:  # a shared actor another ingress already loaded
            return self._loaded(0.0, 0.0, verified=False), None
        try:
            found = version_files(spec, files, public_keys, require_manifest)
            spec = found.spec
            # Ray gives a GPU actor its own CUDA_VISIBLE_DEVICES: its device is cuda:0.
            local = local_device(spec.device)
            if local.startswith("cuda"):
                local = "cuda:0"
            spec = dataclasses.replace(spec, device=local)
            t0 = time.perf_counter()
            runtime = create_runtime(spec.kind)
            runtime.load(spec)
            t1 = time.perf_counter()
            try:
                runtime.infer(warmup or make_warmup_inputs(runtime.inputs))
            except Exception:
                runtime.close()
                raise
        except ServerError as exc:
            return None, ErrorInfo(exc.code.value, exc.message)
        except Exception as exc:
            message = f"model {spec.model_name!r} failed to load: {type(exc).__name__}: {exc}"
            return None, ErrorInfo(ModelLoadError.code.value, message, traceback.format_exc())
        self._runtime = runtime
        loaded = self._loaded(t1 - t0, time.perf_counter() - t1, verified=found.verified)
        return dataclasses.replace(loaded, store_fetch=found.store_fetch), None

    def _loaded(self, load_s: float, warmup_s: float, *, verified: bool) -> ActorLoaded:
        runtime = self._runtime
        assert runtime is not None
        return ActorLoaded(
            inputs=list(runtime.inputs),
            outputs=list(runtime.outputs),
            supports_batching=runtime.supports_batching,
            load_s=load_s,
            warmup_s=warmup_s,
            footprint_bytes=psutil.Process().memory_full_info().uss,
            pid=os.getpid(),
            verified=verified,
        )

    def infer(self, inputs: dict[str, np.ndarray]) -> ActorReply:
        """Run one batch; an error comes back as data."""
        runtime = self._runtime
        if runtime is None:
            return None, ErrorInfo(ErrorCode.MODEL_NOT_READY.value, "the model is not loaded")
        try:
            return runtime.infer(inputs), None
        except Exception as exc:
            return None, _error(exc)

    def acquire(self, ingress: str) -> int:
        """Take a lease for ``ingress`` (a shared actor); returns the leases held."""
        self._leases.add(ingress)
        return len(self._leases)

    def release(self, ingress: str) -> int:
        """Give back ``ingress``'s lease; returns the leases left (0: stop the actor)."""
        self._leases.discard(ingress)
        return len(self._leases)

    def close(self) -> None:
        """Close the runtime (before the actor is killed)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()
