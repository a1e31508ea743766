"""RayInstance: one model replica served by a Ray actor on a node of the cluster.

The third :class:`~modelyard.workers.instance.ModelInstance` beside the inline and the
process ones; the manager places it on a device ``NODE/cpu`` or ``NODE/cuda:N`` and the
actor is pinned to that node (node affinity, not soft) and given the node's Ray
resources (``num_cpus``, ``num_gpus``), so Ray never starts it elsewhere behind the
budget's back.

The data path: inputs up to ``ray.inline_max_bytes`` travel inside the call; larger
ones are put in the object store first (one copy into shared memory on this node, read
zero-copy by an actor on the same node). A call's deadline bounds the wait; on expiry
the call is cancelled (``ray.cancel``: a queued call never runs) and, as a worker
process would be, the actor is killed (a running call cannot be interrupted) and the
model restarted. Priorities are the
scheduler's: it decides the order calls reach the actor, which runs them in order.

A generative model (``llama_cpp``, ``transformers``) runs in a
:class:`~modelyard.workers.ray_generation.GenerativeActor`, a threaded actor whose
``generate`` is a Ray streaming generator: each chunk reaches the server as the runtime
produces it, and a stream the server leaves early (client gone, deadline) is cancelled
in the actor.

Faults: the node lost (``node_lost``, from the cluster watcher) or the actor dead
(Ray's ``RayActorError``) fails every call in flight at once with WorkerCrashedError
(HTTP 503) and fires the exit callback once, so the manager restarts the model, on
another node if its own is gone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from modelyard.errors import (
    DeadlineExceededError,
    ModelLoadError,
    ModelNotReadyError,
    ServerError,
    WorkerCrashedError,
    WorkerLostError,
)
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.repository.store import StoreError, store_relative_path
from modelyard.runtimes import GENERATIVE_KINDS
from modelyard.workers.exits import rebuild_error
from modelyard.workers.instance import (
    ExitCallback,
    GenerationCounters,
    InstanceInfo,
    StartRequest,
)
from modelyard.workers.messages import ErrorInfo
from modelyard.workers.ray_actor import ActorLoaded, ModelActor
from modelyard.workers.ray_cluster import RayCluster
from modelyard.workers.ray_files import NodeFiles
from modelyard.workers.ray_generation import GenerativeActor, GenerativeLoaded
from modelyard.workers.streams import generate_chunk, generation_job

__all__ = ["RayInstance"]

log = logging.getLogger("modelyard.ray")

_RemoteActor: Any = ray.remote(ModelActor)
_RemoteGenerative: Any = ray.remote(GenerativeActor)
_GENERATIVE_CONCURRENCY = 64
"""Threads of a generative actor: one per open stream (most wait for their next chunk),
plus cancels and counter queries. The server's generation gate bounds the streams."""
_BACKGROUND = ThreadPoolExecutor(max_workers=2, thread_name_prefix="modelyard-ray")
"""Runs Ray's blocking control calls (cancel, kill) off the event loop."""


def _quietly(fn: Any, *args: Any, **kwargs: Any) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:
        log.debug("Ray call %s failed", getattr(fn, "__name__", fn), exc_info=True)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome (no 'exception never retrieved')."""
    if not fut.cancelled():
        fut.exception()


class RayInstance:
    """A model served from a Ray actor (``serve --ray``)."""

    def __init__(
        self,
        cluster: RayCluster,
        *,
        public_keys: list[str],
        require_manifest: bool,
        load_timeout_s: float = 120.0,
        repository_root: Path | None = None,
    ) -> None:
        self._cluster = cluster
        self._repository_root = repository_root
        self._config = cluster.config
        self._public_keys = public_keys
        self._require_manifest = require_manifest
        self._load_timeout_s = load_timeout_s
        self._actor: Any = None
        self._device = ""
        self._name = ""
        self._ready = False
        self._dead_reason = ""
        self._lost: asyncio.Future[str] | None = None
        self._on_exit: ExitCallback | None = None
        self._generative = False
        self._from_spare = False
        self._seqs = itertools.count(1)

    @property
    def is_alive(self) -> bool:
        """True while the actor serves."""
        return self._ready and not self._dead_reason

    @property
    def device(self) -> str:
        """The device ``NODE/…`` the actor runs on."""
        return self._device

    @property
    def model_name(self) -> str:
        """The model this actor serves."""
        return self._name

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Called once if the actor or its node dies."""
        self._on_exit = callback

    # ----------------------------------------------------------------------- start

    async def start(self, request: StartRequest) -> InstanceInfo:
        """Create the actor on the device's node, load and warm the model there."""
        spec = request.spec
        self._name, self._device = spec.model_name, spec.device
        self._lost = asyncio.get_running_loop().create_future()
        node_id = self._cluster.node_id_for(spec.device)
        if node_id is None:
            raise ModelLoadError(f"model {self._name!r}: node of {spec.device} is not alive")
        refusal = self._cluster.placement_refusal(spec.device, self._name)
        if refusal:
            raise ModelLoadError(refusal)
        options: dict[str, Any] = {
            "num_cpus": self._config.actor_num_cpus,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
            "max_restarts": 0,
        }
        if "/cuda:" in spec.device:
            options["num_gpus"] = self._config.actor_num_gpus
        self._generative = spec.kind in GENERATIVE_KINDS
        if self._generative:
            options["max_concurrency"] = _GENERATIVE_CONCURRENCY
        # A generative actor holds its streams' state: one server's, never shared.
        if self._config.shared_workers and not self._generative:
            options.update(
                name=f"{spec.model_name}:{spec.version_dir.rsplit('/', 1)[-1]}@{spec.device}",
                namespace=self._config.namespace,
                get_if_exists=True,
                lifetime="detached",
            )
        files = self._node_files(spec.version_dir)
        t0 = time.perf_counter()
        try:
            spare = None
            if not self._generative and not self._config.shared_workers:
                spare = self._cluster.claim_spare(spec.device)
            self._from_spare = spare is not None
            if spare is not None:
                self._actor = spare
            else:
                remote = _RemoteGenerative if self._generative else _RemoteActor
                self._actor = remote.options(**options).remote()
            self._cluster.watch(spec.device, self)
            if self._config.shared_workers and not self._generative:
                await self._call(self._actor.acquire.remote(self._cluster.ingress_id), None)
            if self._generative:
                load = self._actor.load.remote(
                    spec, self._public_keys, self._require_manifest, not request.awaited, files
                )
            else:
                load = self._actor.load.remote(
                    spec, request.warmup_inputs, self._public_keys, self._require_manifest, files
                )
            reply: tuple[ActorLoaded | GenerativeLoaded | None, Any] = await self._call(
                load, self._load_timeout_s
            )
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, ServerError):
                raise ModelLoadError(f"model {self._name!r} failed to start: {exc}") from exc
            raise
        loaded, error = reply
        if loaded is None:
            await self.stop()
            raise ModelLoadError(rebuild_error(error).message)
        self._ready = True
        if isinstance(loaded, GenerativeLoaded):
            return self._generative_info(loaded, time.perf_counter() - t0)
        return InstanceInfo(
            inputs=loaded.inputs,
            outputs=loaded.outputs,
            supports_batching=loaded.supports_batching,
            footprint_bytes=loaded.footprint_bytes,
            process_start_s=time.perf_counter() - t0 - loaded.load_s - loaded.warmup_s,
            load_s=loaded.load_s,
            warmup_s=loaded.warmup_s,
            pid=None,  # a pid on another node means nothing to this host
            details={
                "ray_node": self._device.rpartition("/")[0],
                "actor_pid": loaded.pid,
                "manifest_verified_on_node": loaded.verified,
                "store_fetch": loaded.store_fetch,
                "from_spare": self._from_spare,
            },
        )

    def _node_files(self, version_dir: str) -> NodeFiles | None:
        """Where the actor fetches ``version_dir`` from (``ray.model_store``), or None:
        the node reads the server's path."""
        store = self._config.model_store
        if store is None:
            return None
        if self._repository_root is None:
            raise StoreError(f"model {self._name!r}: no repository to map onto the model store")
        relative = store_relative_path(Path(version_dir), self._repository_root)
        return NodeFiles(store, self._config.node_cache_dir, relative)

    def _generative_info(self, loaded: GenerativeLoaded, start_s: float) -> InstanceInfo:
        st = loaded.stats
        return InstanceInfo(
            inputs=[],
            outputs=[],
            supports_batching=False,
            # As for a worker process: the KV cache is charged whole from the start.
            footprint_bytes=loaded.footprint_bytes + st.kv_cache_bytes,
            process_start_s=start_s - loaded.load_s - loaded.warmup_s,
            load_s=loaded.load_s,
            warmup_s=loaded.warmup_s,
            pid=None,
            details={
                "ray_node": self._device.rpartition("/")[0],
                "actor_pid": loaded.pid,
                "manifest_verified_on_node": loaded.verified,
                "store_fetch": loaded.store_fetch,
                "context_length": st.context_length,
                "parallel": st.parallel,
                "kv_cache_bytes": st.kv_cache_bytes,
            },
        )

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        """Stream one generation from the actor; closing the iterator early cancels it
        there; WorkerCrashedError if the actor or its node dies meanwhile."""
        if not self.is_alive or not self._generative:
            raise self._not_serving()
        seq = next(self._seqs)
        stream = self._actor.generate.remote(generation_job(seq, request))
        finished = False
        try:
            while not finished:
                item = await self._next_chunk(stream)
                if item is None:  # the actor's generator ended without a last chunk
                    raise WorkerCrashedError(f"model {self._name!r}: its stream ended early")
                if isinstance(item, ErrorInfo):
                    finished = True
                    raise rebuild_error(item)
                finished = item.finish_reason is not None
                yield generate_chunk(item)
        finally:
            if not finished and self.is_alive:
                # The consumer left before the end: free the actor's sequence now.
                self._actor.cancel.remote(seq)

    async def _next_chunk(self, stream: Any) -> Any:
        """The next item of a Ray streaming generator, or None at its end; fails at once
        if the node is lost."""
        lost = self._lost
        assert lost is not None
        step = asyncio.ensure_future(stream.__anext__())
        await asyncio.wait({step, lost}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            step.cancel()
            raise self._crashed()
        try:
            ref = step.result()
        except StopAsyncIteration:
            return None
        except RayActorError as exc:
            self._died(f"its Ray actor died: {type(exc).__name__}")
            raise self._crashed() from None
        return await self._call(ref, None)

    async def generation_counters(self, timeout_s: float = 5.0) -> GenerationCounters:
        """The actor's own generation counters."""
        if not self.is_alive or not self._generative:
            raise self._not_serving()
        stats: GenerationCounters = await self._call(self._actor.stats.remote(), timeout_s)
        return stats

    # ----------------------------------------------------------------------- infer

    async def infer(self, inputs: dict[str, np.ndarray], timeout_s: float) -> dict[str, np.ndarray]:
        """Run one batch in the actor, within ``timeout_s``."""
        if not self.is_alive:
            raise self._not_serving()
        if timeout_s <= 0:
            raise DeadlineExceededError(f"model {self._name!r}: no time left to run the request")
        payload: Any = inputs
        if sum(a.nbytes for a in inputs.values()) > self._config.inline_max_bytes:
            payload = ray.put(inputs)
        try:
            outputs, error = await self._call(self._actor.infer.remote(payload), timeout_s)
        except DeadlineExceededError:
            # As with a worker process: an overrunning actor is killed (a Ray call that
            # runs cannot be interrupted, and every later call would queue behind it).
            self._died("killed after overrunning its deadline")
            _BACKGROUND.submit(_quietly, ray.kill, self._actor, no_restart=True)
            raise
        if error is not None:
            raise rebuild_error(error)
        assert isinstance(outputs, dict)
        return outputs

    async def _call(self, ref: Any, timeout_s: float | None) -> Any:
        """Await ``ref``; fail at once if the node is lost, cancel it on timeout."""
        lost = self._lost
        assert lost is not None
        result: asyncio.Future[Any] = asyncio.wrap_future(ref.future())
        try:
            done, _ = await asyncio.wait(
                {result, lost}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            result.add_done_callback(_consume)
            self._cancel(ref)
            raise
        if result in done:
            try:
                return result.result()
            except RayActorError as exc:
                self._died(f"its Ray actor died: {type(exc).__name__}")
                raise self._crashed() from None
            except RayError as exc:
                raise WorkerCrashedError(
                    f"model {self._name!r}: Ray call failed: {type(exc).__name__}: {exc}"
                ) from None
        result.add_done_callback(_consume)
        if lost in done:
            raise self._crashed()  # nothing to cancel: the actor's node is gone
        self._cancel(ref)
        raise DeadlineExceededError(
            f"model {self._name!r} ran past its deadline ({timeout_s or 0:.3f}s) on {self._device}"
        )

    @staticmethod
    def _cancel(ref: Any) -> None:
        # ray.cancel and ray.kill are RPCs that can block for tens of seconds when the
        # actor's node is going: never on the event loop.
        _BACKGROUND.submit(_quietly, ray.cancel, ref)

    # ---------------------------------------------------------------------- faults

    def node_lost(self, reason: str) -> None:
        """The node of this actor is gone: fail the calls in flight now, report dead."""
        self._died(reason)

    def _died(self, reason: str) -> None:
        if self._dead_reason:
            return
        self._dead_reason = reason
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(reason)
        was_ready, self._ready = self._ready, False
        if was_ready and self._on_exit is not None:
            self._on_exit(reason)

    def _crashed(self) -> WorkerCrashedError:
        # Its node or actor died under the call: the call may run once more elsewhere.
        return WorkerLostError(
            f"model {self._name!r}: its worker on {self._device} died ({self._dead_reason})"
        )

    def _not_serving(self) -> ServerError:
        if self._dead_reason:
            return self._crashed()
        return ModelNotReadyError(f"model {self._name!r} is not loaded")

    # ------------------------------------------------------------------------ stop

    async def stop(self) -> None:
        """Give back this ingress's lease; the last one (or a private actor) kills it."""
        self._ready = False
        actor, self._actor = self._actor, None
        self._cluster.unwatch(self._device, self)
        if actor is None:
            return
        if self._config.shared_workers and not self._generative and not self._dead_reason:
            try:
                left = await _bounded(actor.release.remote(self._cluster.ingress_id), 5.0)
            except Exception:
                left = 0
            if left:
                return
        _BACKGROUND.submit(_quietly, ray.kill, actor, no_restart=True)


async def _bounded(ref: Any, timeout_s: float) -> Any:
    return await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout_s)
