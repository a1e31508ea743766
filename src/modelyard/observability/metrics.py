"""Every Prometheus metric of the server, defined once, against an injected registry.

Three kinds of figures, three ways in:

* **Request path** (hot): :meth:`Metrics.request_done`, :meth:`Metrics.cold_start_wait`
  and the scheduler hook from :meth:`Metrics.batch_hook`. Label children are cached per
  model version; a successful request and its model call are appended to a list and
  counted in batches (:data:`FOLD_AT`, :meth:`Metrics.fold`) before any read.
* **Lifecycle** (cold): :meth:`Metrics.on_event`, an :class:`EventLog` listener, counts
  loads, unloads, evictions, crashes, restarts and load failures, and times model switches.
* **State** (at scrape time): :meth:`Metrics.bind` registers a collector that reads the
  manager when ``/metrics`` is scraped: model states, bytes per model and device, queue
  depth, in-flight requests, breaker state, worker memory. Workers report their figures
  over their channel into ``record.info``; only the server process serves ``/metrics``.

Names follow ``modelyard_<subsystem>_<what>_<unit>``; label values come from bounded
sets (model, version, device, code, state, kind), never from requests.

The same calls feed :class:`~modelyard.observability.traffic.RecentTraffic` (``traffic.py``),
the per-second figures the dashboard draws. The scrape-time collector is in
``collector.py``, its CUDA readings in ``cuda.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from modelyard.clock import Clock, MonotonicClock
from modelyard.errors import CLIENT_ERROR_CODES, ErrorCode, ServerError
from modelyard.observability.collector import ManagerCollector
from modelyard.observability.histogram import FastHistogram, HistogramChild
from modelyard.observability.seed_metrics import SeedMetrics
from modelyard.observability.traffic import RecentTraffic

if TYPE_CHECKING:
    from modelyard.manager.events import Event
    from modelyard.manager.manager import ModelManager

log = logging.getLogger("modelyard.metrics")

OK = "ok"
"""The ``code`` of a request that succeeded; failures use their ``ErrorCode`` value."""


def outcome_code(exc: BaseException) -> str:
    """The ``code`` a request that ended by raising ``exc`` is counted under."""
    if isinstance(exc, ServerError):
        return exc.code
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return ErrorCode.CANCELLED  # the client left (a stream closed early)
    if isinstance(exc, Exception):
        return ErrorCode.INTERNAL
    return OK


LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
SWITCH_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
TOKENS_PER_SECOND_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

_EVENT_COUNTERS = {
    "loaded": "loads",
    "unloaded": "unloads",
    "evicted": "evictions",
    "crashed": "crashes",
    "restarted": "restarts",
}
_LOAD_FAILURES = {"load_failed": "failed", "load_refused": "refused", "verify_failed": "verify"}

BatchHook = Callable[[int, list[float], float], None]
"""The scheduler's ``on_batch(batch_rows, queue_wait_s_per_request, compute_s)``."""


# --------------------------------------------------------------------------- metrics


@dataclass(slots=True)
class _VersionMetrics:
    """The cached label children of one model version (``.labels()`` is slow)."""

    model: str
    version: str
    requests: dict[str, Counter]
    request_seconds: HistogramChild
    queue_seconds: HistogramChild
    compute_seconds: HistogramChild
    batch_rows: HistogramChild
    batch_compute_seconds: HistogramChild
    cold_start_seconds: HistogramChild
    recent: RecentTraffic
    seed_latency_ms: HistogramChild | None
    """``model_inference_latency`` (milliseconds) when seed names are on."""


FOLD_AT = 256
"""Successful requests (and model calls) kept pending before they are counted at once.

The request path appends a tuple instead of taking a counter's lock and observing five
histograms and the per-second traffic per request; :meth:`Metrics.fold` counts them
(one counter increment per model version) when this many are pending, when a request
fails or waits for a load (so the per-second traffic stays in order), and before every
read: a scrape, or the dashboard's traffic. Nothing reads the figures in between."""


class _Fold(Collector):
    """A collector without families whose collect() folds the pending observations."""

    def __init__(self, fold: Callable[[], None]) -> None:
        self._fold = fold

    def describe(self) -> list[Metric]:
        """No families (the registry's duplicate check calls this, not collect)."""
        return []

    def collect(self) -> list[Metric]:
        """Fold, yield nothing."""
        self._fold()
        return []


class Metrics:
    """Every metric of one server, registered on ``registry`` (tests pass a fresh one)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        clock: Clock | None = None,
        horizon_s: int = 300,
        process_metrics: bool = True,
        seed_names: bool = False,
    ) -> None:
        self.registry = registry
        self.horizon_s = horizon_s
        """Seconds of per-second traffic kept for the dashboard."""
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._versions: dict[tuple[str, str], _VersionMetrics] = {}
        self._bound = False
        # Successful requests and model calls wait here, folded in before any read.
        self._done: list[tuple[_VersionMetrics, float, int]] = []
        self._calls: list[tuple[_VersionMetrics, int, list[float], float]] = []
        # Registered first, so the registry's collect() folds before reading any family.
        registry.register(_Fold(self.fold))
        self.seed = SeedMetrics(registry) if seed_names else None
        """The design notes' metric names beside the native ones (``metrics.seed_names``)."""
        mv = ("model", "version")

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> FastHistogram:
            return FastHistogram(name, doc, mv, buckets=buckets, registry=registry)

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*mv, *extra], registry=registry)

        self.requests = counter(
            "modelyard_inference_requests",
            "Inference requests answered, by outcome (code: ok or the error code).",
            "code",
        )
        self.request_seconds = histogram(
            "modelyard_inference_request_duration_seconds",
            "Time from receipt to answer of an inference request (any outcome).",
            LATENCY_BUCKETS_S,
        )
        self.queue_seconds = histogram(
            "modelyard_inference_queue_duration_seconds",
            "Time a request waited in the model's queue before its model call.",
            LATENCY_BUCKETS_S,
        )
        self.compute_seconds = histogram(
            "modelyard_inference_compute_duration_seconds",
            "Duration of the model call that served a request (its batch's call).",
            LATENCY_BUCKETS_S,
        )
        self.batch_rows = histogram(
            "modelyard_scheduler_batch_size_rows", "Rows in each model call.", BATCH_SIZE_BUCKETS
        )
        self.batch_compute_seconds = histogram(
            "modelyard_scheduler_batch_compute_seconds",
            "Duration of each model call (one batch).",
            LATENCY_BUCKETS_S,
        )
        self.cold_start_seconds = histogram(
            "modelyard_model_cold_start_wait_seconds",
            "How long a request waited for its model to load (cache misses).",
            SWITCH_BUCKETS_S,
        )
        self.switch_seconds = histogram(
            "modelyard_model_switch_latency_seconds",
            "Model-switch latency: a load from admission to ready (queue, start, load, warm-up).",
            SWITCH_BUCKETS_S,
        )
        self.lifecycle = {
            name: counter(f"modelyard_model_{name}", f"Model {name}, from the event log.")
            for name in _EVENT_COUNTERS.values()
        }
        self.load_failures = counter(
            "modelyard_model_load_failures",
            "Failed loads by reason: failed (an error), refused (no memory), verify (checksum).",
            "reason",
        )
        self.events = counter(
            "modelyard_model_events",
            "Every lifecycle event by kind, including kinds without a counter of their own.",
            "kind",
        )
        self.ttft_seconds = histogram(
            "modelyard_generation_time_to_first_token_seconds",
            "Generation: time from receipt of a request to its first text chunk.",
            LATENCY_BUCKETS_S,
        )
        self.tpot_seconds = histogram(
            "modelyard_generation_time_per_output_token_seconds",
            "Generation: time per generated token after the first, per request.",
            TOKEN_BUCKETS_S,
        )
        self.tokens_per_second = histogram(
            "modelyard_generation_tokens_per_second",
            "Generation: tokens per second of each request's decoding.",
            TOKENS_PER_SECOND_BUCKETS,
        )
        self.prompt_tokens = counter(
            "modelyard_generation_prompt_tokens", "Generation: prompt tokens evaluated."
        )
        self.generated_tokens = counter(
            "modelyard_generation_generated_tokens",
            "Generation: tokens generated (as counted by the workers).",
        )
        self.fallbacks = Counter(
            "modelyard_inference_fallbacks",
            "Requests answered by a fallback model, by requested model, fallback and reason "
            "(queue_full, deadline, shed, circuit_open, unavailable).",
            ["model", "fallback", "reason"],
            registry=registry,
        )
        self.brownouts = Counter(
            "modelyard_generation_brownouts",
            "Generation requests run with max_tokens capped by brownout (the model was "
            "overloaded when they arrived; counted once given a slot), by model.",
            ["model"],
            registry=registry,
        )
        self.preemptions = Counter(
            "modelyard_generation_preemptions",
            "Generation streams paused for a more important request (they resume from "
            "their tokens), by model.",
            ["model"],
            registry=registry,
        )
        if process_metrics:
            ProcessCollector(namespace="modelyard", registry=registry)

    # ----------------------------------------------------------------- hot path

    def _of(self, model: str, version: str) -> _VersionMetrics:
        found = self._versions.get((model, version))
        if found is None:
            found = self._versions[(model, version)] = _VersionMetrics(
                model=model,
                version=version,
                requests={},
                request_seconds=self.request_seconds.labels(model, version),
                queue_seconds=self.queue_seconds.labels(model, version),
                compute_seconds=self.compute_seconds.labels(model, version),
                batch_rows=self.batch_rows.labels(model, version),
                batch_compute_seconds=self.batch_compute_seconds.labels(model, version),
                cold_start_seconds=self.cold_start_seconds.labels(model, version),
                recent=RecentTraffic(self.horizon_s),
                seed_latency_ms=(
                    None if self.seed is None else self.seed.latency_child(model, version)
                ),
            )
        return found

    def request_done(
        self,
        model: str,
        version: str,
        code: str,
        total_s: float,
        queue_s: float | None = None,
        compute_s: float | None = None,
    ) -> None:
        """One inference request answered; ``code`` is ``"ok"`` or an ``ErrorCode`` value.

        ``model``/``version`` must name a known version (``""`` for requests that named no
        existing model). Pass ``queue_s``/``compute_s`` only where the scheduler's
        :meth:`batch_hook` is not installed, or they are counted twice.
        """
        m = self._of(model, version)
        if code == OK and queue_s is None and compute_s is None:
            done = self._done
            done.append((m, total_s, int(self._clock.monotonic())))
            if len(done) >= FOLD_AT:
                self.fold()
            return
        self.fold()  # the per-second traffic must see earlier requests first
        counter = m.requests.get(code)
        if counter is None:
            counter = m.requests[code] = self.requests.labels(model, version, str(code))
        counter.inc()
        m.request_seconds.observe(total_s)
        if m.seed_latency_ms is not None:
            m.seed_latency_ms.observe(total_s * 1000.0)
        if queue_s is not None:
            m.queue_seconds.observe(queue_s)
        if compute_s is not None:
            m.compute_seconds.observe(compute_s)
        is_client_error = code in CLIENT_ERROR_CODES
        m.recent.request(
            int(self._clock.monotonic()),
            total_s,
            is_error=code != OK and not is_client_error,
            is_client_error=is_client_error,
        )

    def batch_hook(self, model: str, version: str) -> BatchHook:
        """The scheduler's ``on_batch`` for one model version: batch, queue and compute."""
        m = self._of(model, version)

        calls = self._calls
        fold = self.fold

        def on_batch(rows: int, queue_waits_s: list[float], compute_s: float) -> None:
            calls.append((m, rows, queue_waits_s, compute_s))
            if len(calls) >= FOLD_AT:
                fold()

        return on_batch

    def fold(self) -> None:
        """Count what the request path left pending (see :data:`FOLD_AT`): the registry's
        collect and :meth:`recent_traffic` call it first, so every read sees it all."""
        done, self._done = self._done, []
        if done:
            succeeded: dict[int, tuple[_VersionMetrics, int]] = {}
            for m, total_s, second in done:
                m.request_seconds.observe(total_s)
                if m.seed_latency_ms is not None:
                    m.seed_latency_ms.observe(total_s * 1000.0)
                m.recent.succeeded(second, total_s)
                seen = succeeded.get(id(m))
                succeeded[id(m)] = (m, 1 if seen is None else seen[1] + 1)
            for m, n in succeeded.values():  # one counter lock per version, not per request
                counter = m.requests.get(OK)
                if counter is None:
                    counter = m.requests[OK] = self.requests.labels(m.model, m.version, OK)
                counter.inc(n)
        calls, self._calls[:] = list(self._calls), []
        for m, rows, queue_waits_s, compute_s in calls:
            m.batch_rows.observe(rows)
            m.batch_compute_seconds.observe(compute_s)
            m.queue_seconds.observe_each(queue_waits_s)
            m.compute_seconds.observe_repeated(compute_s, len(queue_waits_s))

    def fallback(self, model: str, fallback: str, reason: str) -> None:
        """A request for ``model`` was answered by ``fallback`` because of ``reason``."""
        self.fallbacks.labels(model, fallback, reason).inc()

    def preempted(self, model: str) -> None:
        """A generation stream of ``model`` gave its slot to a more important request."""
        self.preemptions.labels(model).inc()

    def brownout(self, model: str) -> None:
        """Brownout capped the ``max_tokens`` of a generation request for ``model``."""
        self.brownouts.labels(model).inc()

    def cold_start_wait(self, model: str, version: str, wait_s: float) -> None:
        """A request found its model not ready and waited ``wait_s`` for the load."""
        self.fold()  # the per-second traffic must see earlier requests first
        m = self._of(model, version)
        m.cold_start_seconds.observe(wait_s)
        m.recent.cold_start(int(self._clock.monotonic()))
        if self.seed is not None:
            self.seed.switch(model, wait_s)

    def generation_done(
        self,
        model: str,
        version: str,
        *,
        ttft_s: float,
        decode_s: float,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """One generation stream ended (any outcome) after its first chunk."""
        mv = (model, version)
        self._of(model, version).recent.generation(
            int(self._clock.monotonic()), ttft_s, completion_tokens
        )
        self.ttft_seconds.labels(*mv).observe(ttft_s)
        self.prompt_tokens.labels(*mv).inc(prompt_tokens)
        self.generated_tokens.labels(*mv).inc(completion_tokens)
        if completion_tokens > 1 and decode_s > 0:
            self.tpot_seconds.labels(*mv).observe(decode_s / (completion_tokens - 1))
            self.tokens_per_second.labels(*mv).observe((completion_tokens - 1) / decode_s)

    # ----------------------------------------------------------------- lifecycle events

    def on_event(self, event: Event) -> None:
        """EventLog listener: count the event, time model switches; never raises."""
        try:
            mv = (event.model, event.version)
            self.events.labels(*mv, event.kind).inc()
            counter = _EVENT_COUNTERS.get(event.kind)
            if counter is not None:
                self.lifecycle[counter].labels(*mv).inc()
            reason = _LOAD_FAILURES.get(event.kind)
            if reason is not None:
                self.load_failures.labels(*mv, reason).inc()
            if event.kind == "loaded" and event.duration_s is not None:
                self.switch_seconds.labels(*mv).observe(event.duration_s)
        except Exception:  # a listener must not break the manager
            log.exception("metrics: could not count event %s", event)

    # ----------------------------------------------------------------- state at scrape time

    def bind(self, manager: ModelManager) -> None:
        """Register the collector that reads ``manager`` whenever ``/metrics`` is scraped."""
        if self._bound:
            raise RuntimeError("Metrics.bind: already bound to a manager")
        self.registry.register(ManagerCollector(manager))
        if self.seed is not None:
            self.seed.bind(manager)
        self._bound = True

    # ----------------------------------------------------------------- dashboard feed

    def recent_traffic(self, window_s: int) -> dict[str, Any]:
        """Per-second traffic of every model version over the last ``window_s`` seconds."""
        self.fold()
        length = max(1, min(window_s, self.horizon_s))
        end = int(self._clock.monotonic())
        return {
            "interval_s": 1,
            "window_s": length,
            "end_time": float(int(time.time())),
            "models": [
                {"name": m.model, "version": m.version, **m.recent.window(end, length)}
                for m in self._versions.values()
                if m.model
            ],
        }
