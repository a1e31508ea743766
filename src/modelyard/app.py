"""The composition root: builds every part from settings; ordered start and stop.

``cli.py`` and the tests start servers through the same :class:`App`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from modelyard.clock import Clock, MonotonicClock
from modelyard.config.model_config import ModelConfig
from modelyard.config.security import SecurityError, check_exposure
from modelyard.config.settings import ServerSettings
from modelyard.errors import (
    ModelNotReadyError,
    ServerError,
    hide_path_prefix,
)
from modelyard.frontends.auth import Authorizer
from modelyard.frontends.dataplane import DataPlane
from modelyard.frontends.http.app import create_app
from modelyard.frontends.http.server_config import uvicorn_config
from modelyard.frontends.http.tls import uvicorn_tls_options
from modelyard.frontends.ports import unbindable_ports
from modelyard.manager.execute import replica_execute
from modelyard.manager.fallback import chain_problems
from modelyard.manager.manager import ModelManager
from modelyard.manager.poller import RepositoryPoller
from modelyard.manager.records import ModelRecord, Replica
from modelyard.manager.stats import VersionView
from modelyard.manager.versions import VersionController
from modelyard.observability.health import HealthView
from modelyard.observability.metrics import Metrics
from modelyard.scheduling.config import SchedulerConfig
from modelyard.scheduling.generation_scheduler import GenerationLimits, GenerationScheduler
from modelyard.scheduling.scheduler import ModelScheduler
from modelyard.service.model_service import ModelService
from modelyard.stop_signals import SignallessServer, watch_stop_signals
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.inline import InlineInstance
from modelyard.workers.instance import ModelInstance

log = logging.getLogger("modelyard")

# The request path allocates short-lived objects by the thousand; a larger young
# generation keeps collections rare without letting garbage pile up.
_GC_GEN0_THRESHOLD = 20_000


class StartupError(RuntimeError):
    """The server could not start (a port could not be bound, …)."""


async def _serve_http(server: uvicorn.Server) -> None:
    # uvicorn reports a failed bind with sys.exit(); a SystemExit escaping a task would
    # stop the whole event loop, so it becomes an ordinary error here.
    try:
        await server.serve()
    except SystemExit as exc:
        raise StartupError(f"the HTTP server exited during start-up ({exc.code})") from None


class App:
    """One modelyard server: manager, schedulers, REST (and gRPC) front ends."""

    def __init__(self, settings: ServerSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or MonotonicClock()
        """The one clock of deadlines, load timings, breakers and traffic windows."""
        # Error messages show model files relative to these folders, never absolutely.
        root = settings.repository_root
        hide_path_prefix(str(root))
        for model in settings.models:
            folder = settings.model_path(model)
            if not folder.is_relative_to(root):
                hide_path_prefix(str(folder.parent))
        self.metrics = Metrics(
            CollectorRegistry(), clock=self.clock, seed_names=settings.metrics.seed_names
        )
        """Every Prometheus metric of this server; served at ``/metrics``."""
        self.manager = ModelManager(
            settings,
            self._make_instance,
            on_ready=self._on_ready,
            on_unloaded=self._on_unloaded,
            on_replica_ready=self._on_replica_ready,
            on_replica_stopped=self._on_replica_stopped,
            clock=self.clock,
        )
        self.versions = VersionController(self.manager, settings.rollback_grace_s)
        self.poller: RepositoryPoller | None = None
        if settings.model_control_mode == "poll":
            self.poller = RepositoryPoller(
                self.manager, self.versions, settings.poll_interval_s, settings.poll_settle_s
            )
        self.manager.events.listeners.append(self.metrics.on_event)
        self.metrics.bind(self.manager)
        self.service = ModelService(self.manager, self.versions)
        """What the front ends see of the model table (they never import the manager)."""
        self.dataplane = DataPlane(self.service, self.metrics, settings.limits, self.clock)
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._grpc: Any = None
        self._worker_factory: WorkerFactory | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._closing_tasks: set[asyncio.Task[None]] = set()
        self._started = False
        self._sampler: asyncio.Task[None] | None = None
        self.security = settings.security.relative_to(Path(settings.config_dir))
        """The security settings, file paths resolved from the YAML's folder."""
        self.authorizer: Authorizer | None = None

    # ------------------------------------------------------------------ composition

    def _make_instance(self, config: ModelConfig) -> ModelInstance:
        if config.isolation == "inline":
            return InlineInstance()
        from modelyard.workers.process import ProcessInstance

        if self._worker_factory is None:
            raise ModelNotReadyError("worker processes are not available (server stopping)")
        return ProcessInstance(self._worker_factory, overrun_grace_s=config.overrun_grace_s)

    async def _on_ready(self, record: ModelRecord) -> None:
        if record.scheduler is not None:
            return
        await self._attach_schedulers(record, record.first)

    async def _on_replica_ready(self, record: ModelRecord, replica: Replica) -> None:
        await self._attach_schedulers(record, replica)

    async def _attach_schedulers(self, record: ModelRecord, replica: Replica) -> None:
        """Give a replica whose worker is ready its scheduler(s): the tensor one and, for
        a generative model, a generation scheduler sharing its breaker."""
        scheduler = await self._make_scheduler(record, None if replica is record.first else replica)
        if record.config.is_generative:
            # Both before either is seen: the router takes a replica whose scheduler runs.
            replica.generation = await self._make_generation(record, replica, scheduler)
        replica.scheduler = scheduler

    async def _make_generation(
        self, record: ModelRecord, replica: Replica, scheduler: ModelScheduler
    ) -> GenerationScheduler:
        cfg = record.config
        gen = cfg.generation
        limits = GenerationLimits(
            slots=gen.parallel,
            max_queue_size=cfg.max_queue_size,
            default_priority=cfg.priority,
            preempt=gen.preempt,
            brownout_max_tokens=gen.brownout_max_tokens,
            brownout_queue_depth=gen.brownout_queue_depth,
        )
        metrics, name = self.metrics, record.key.name
        generation = GenerationScheduler(
            str(record.key) if replica is record.first else str(replica.key),
            limits,
            replica.generate,
            breaker=scheduler.breaker,
            clock=self.clock,
            on_preempted=lambda: metrics.preempted(name),
            on_brownout=lambda: metrics.brownout(name),
        )
        await generation.start()
        return generation

    async def _make_scheduler(self, record: ModelRecord, replica: Replica | None) -> ModelScheduler:
        """The scheduler of one replica (``None``: the version's first, the record itself)."""
        holder = record.first if replica is None else replica
        info = holder.info
        assert info is not None
        config = SchedulerConfig.from_model_config(
            record.config,
            supports_batching=info.supports_batching,
            max_batch_elements=self.settings.limits.max_request_elements,
        )

        execute = replica_execute(record, holder, self.clock)
        metrics_hook = self.metrics.batch_hook(record.key.name, record.key.version)

        def on_batch(rows: int, queue_waits_s: list[float], compute_s: float) -> None:
            metrics_hook(rows, queue_waits_s, compute_s)
            record.infer_stats.executed(rows, queue_waits_s, compute_s)
            if queue_waits_s:  # the scaler reads the longest wait since its last look
                record.queue_wait_s = max(record.queue_wait_s, max(queue_waits_s))

        name = str(record.key) if replica is None else str(replica.key)
        scheduler = ModelScheduler(name, config, execute, on_batch=on_batch, clock=self.clock)
        key = record.key

        def breaker_changed(old: object, new: object) -> None:
            message = f"circuit breaker {getattr(old, 'value', old)} → {getattr(new, 'value', new)}"
            log.warning("model %s: %s", name, message)
            self.manager.events.add("breaker", key, message)

        scheduler.breaker.on_change = breaker_changed
        await scheduler.start()
        return scheduler

    def _on_unloaded(self, record: ModelRecord) -> None:
        self._close_schedulers(record.first)

    def _on_replica_stopped(self, replica: Replica) -> None:
        self._close_schedulers(replica)

    def _close_schedulers(self, replica: Replica) -> None:
        for scheduler in replica.detach():
            task = asyncio.ensure_future(scheduler.close())
            self._closing_tasks.add(task)
            task.add_done_callback(self._closing_tasks.discard)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the worker factory and front ends, preload models, then report ready."""
        s = self.settings
        try:
            # Before anything binds: an exposed server with an open management plane
            # must not serve a single request.
            check_exposure(s.host, self.security)
            self.authorizer = Authorizer.from_config(self.security)
            tls_options = uvicorn_tls_options(self.security)
            grpc_credentials = self._grpc_credentials() if s.grpc_port is not None else None
        except SecurityError as exc:
            raise StartupError(str(exc)) from None
        # What can be known now is reported now, not after the slow start below.
        early = unbindable_ports(s.host, {"HTTP": s.http_port, "gRPC": s.grpc_port})
        if s.exit_on_error:
            early += self.manager.preloads()[1]
        if early:
            raise StartupError("\n  ".join(early))
        # Fork server (declared runtimes preloaded) and spare workers: loads skip both.
        kinds = (m.runtime for m in s.models)
        self._worker_factory = WorkerFactory.for_runtimes(kinds, s.spare_worker_count)
        await self._worker_factory.start()
        log.info("worker memory limits: %s", self._worker_factory.memory_limit_backend)
        limits = s.limits
        http_app = create_app(
            self.dataplane,
            s.max_request_bytes,
            self.extra_routes(),
            self.authorizer,
            max_control_body_bytes=limits.max_control_body_bytes,
        )
        await self._start_http(http_app, tls_options)
        if s.grpc_port is not None:
            try:
                await self._start_grpc(grpc_credentials)
            except OSError:
                await self.stop()
                raise StartupError(
                    f"cannot serve gRPC on {s.host}:{s.grpc_port} (address in use or not allowed?)"
                ) from None
        problems = await self.manager.start()
        # Fallbacks must take the same tensors: checked here for the models loaded now
        # (and again before each fallback, for models loaded later).
        problems += chain_problems(self.manager)
        if problems and s.exit_on_error:
            await self.stop()
            raise StartupError(
                "preloaded model(s) cannot serve (set exit_on_error: false to start anyway):\n  "
                + "\n  ".join(problems)
            )
        if self.poller is not None:
            self.poller.start()
        self._sampler = asyncio.create_task(self._sample_memory(), name="modelyard-memory")
        self._started = True
        # Everything built so far lives as long as the server: move it out of the
        # collector's sight, and collect young objects less often, so that full
        # collections (tens of ms with many objects) do not land in request tails.
        gc.collect()
        gc.freeze()
        gc.set_threshold(_GC_GEN0_THRESHOLD, 20, 50)
        self.dataplane.is_serving = True
        log.info("authentication: %s", self.authorizer)
        base = f"{'https' if self.security.is_tls else 'http'}://{s.host}:{self.http_port}"
        log.info(
            "modelyard serving %d model(s) on %s%s",
            len(self.manager.entries),
            base,
            f" and grpc {s.host}:{self.grpc_port}" if self.grpc_port else "",
        )
        log.info("dashboard: %s/dashboard  metrics: %s/metrics", base, base)

    async def _start_http(self, http_app: Any, tls_options: dict[str, Any]) -> None:
        """Serve REST from this process (uvicorn, httptools, the guard of connections.py)."""
        s = self.settings
        assert self._worker_factory is not None
        config = uvicorn_config(http_app, s.host, s.http_port, s.limits, tls_options)
        # Connections still busy when the drain time is up are closed, not waited for.
        config.timeout_graceful_shutdown = math.ceil(s.drain_timeout_s)
        self._http = SignallessServer(config)
        # NOTE: in the main thread uvicorn captures SIGINT/SIGTERM while it serves and
        # re-raises them when it exits, which then reaches run_forever's handler.
        self._http_task = asyncio.create_task(_serve_http(self._http))
        while not self._http.started:
            if self._http_task.done():
                with contextlib.suppress(StartupError):
                    self._http_task.result()
                self._http = None
                await self._worker_factory.close()
                self._worker_factory = None
                raise StartupError(
                    f"cannot serve HTTP on {s.host}:{s.http_port} (address in use or not allowed?)"
                )
            await asyncio.sleep(0.01)
        self.http_port = self._http.servers[0].sockets[0].getsockname()[1]

    def _grpc_credentials(self) -> Any:
        """gRPC's TLS credentials (None: plaintext); raises SecurityError naming the setting."""
        try:
            from modelyard.frontends.grpc.server import server_credentials
        except ImportError:
            return None
        try:
            return server_credentials(self.security)
        except OSError as exc:
            raise SecurityError(f"security.tls_*: cannot read a TLS file for gRPC: {exc}") from None

    async def _start_grpc(self, credentials: Any) -> None:
        try:
            from modelyard.frontends.grpc.server import GrpcLimits, start_grpc_server
        except ImportError:
            log.warning("gRPC front end unavailable (stubs not generated)")
            return
        s = self.settings
        limits = s.limits
        self._grpc, self.grpc_port = await start_grpc_server(
            self.dataplane,
            s.host,
            s.grpc_port or 0,
            GrpcLimits(
                max_message_bytes=limits.grpc_max_message_bytes,
                max_buffered_bytes=limits.grpc_max_buffered_bytes,
                max_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
                max_concurrent_streams=limits.grpc_max_concurrent_streams,
                max_connections=limits.grpc_max_connections,
                max_connection_idle_s=limits.grpc_max_connection_idle_s,
                max_connection_age_s=limits.grpc_max_connection_age_s,
                max_connection_age_grace_s=limits.grpc_max_connection_age_grace_s,
                handshake_timeout_s=limits.header_timeout_s,
            ),
            authorizer=self.authorizer,
            credentials=credentials,
        )

    async def _sample_memory(self) -> None:
        """Keep each worker's live memory in its details, for stats, metrics, dashboard.

        The footprint the budget uses stays the one measured after warm-up; this is
        what an operator watches for a model that grows (a leak shows here first).
        """
        interval = self.settings.memory_sample_interval_s
        while True:
            await asyncio.sleep(interval)
            for record in list(self.manager.records()):
                instance, info = record.instance, record.info
                sample = getattr(instance, "sample_memory", None)
                if sample is None or info is None or not record.is_ready:
                    continue
                try:
                    reading = await sample()
                except ServerError:
                    continue  # the worker is going; its exit is handled elsewhere
                info.details.update(reading.as_details())

    def health_view(self) -> HealthView:
        """Why the server and each model are (not) ready (typed; ``/v2/health/details``
        converts it to JSON)."""
        factory = self._worker_factory
        if self.dataplane.is_serving:
            server_reason = ""
        elif self._http is None:
            server_reason = "stopped"
        else:
            server_reason = "starting" if not self._started else "shutting down"
        now = self.clock.monotonic()
        return HealthView(
            live=True,
            ready=self.dataplane.is_serving,
            reason=server_reason,
            worker_memory_limits=factory.memory_limit_backend if factory else None,
            fork_server_alive=factory.fork_server_alive if factory else False,
            spare_workers=factory.spare_pids if factory else [],
            models=[VersionView.of(r, now) for r in self.manager.records()],
        )

    def extra_routes(self) -> list[Any]:
        """Routes beside the protocol's (metrics, dashboard, admin)."""
        from modelyard.frontends.control import ControlPlane
        from modelyard.frontends.http.admin import admin_routes
        from modelyard.frontends.http.dashboard import dashboard_routes
        from modelyard.frontends.http.metrics import metrics_routes

        control = ControlPlane(self.service, self.health_view)
        return [*admin_routes(control), *metrics_routes(self.metrics), *dashboard_routes(self)]

    async def stop(self) -> None:
        """Stop taking requests, finish in-flight ones, unload every model, stop servers."""
        self.dataplane.is_serving = False
        if self._http is not None:
            # The listener closes now; requests in flight finish while models drain.
            self._http.should_exit = True
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
            self._sampler = None
        if self._grpc is not None:
            from modelyard.frontends.grpc.server import stop_grpc_server

            await stop_grpc_server(self._grpc, 5.0)
            self._grpc = None
        if self.poller is not None:
            await self.poller.close()
        await self.versions.close()
        await self.manager.close()
        await asyncio.gather(*self._closing_tasks, return_exceptions=True)
        if self._http is not None:
            self._http.should_exit = True
            if self._http_task is not None:
                await self._http_task
            self._http = None
        if self._worker_factory is not None:
            await self._worker_factory.close()
            self._worker_factory = None

    async def run_forever(self) -> None:
        """Start, serve until SIGINT/SIGTERM, then stop gracefully within
        ``drain_timeout_s``; a second signal, or a stop that overruns, exits at once
        (:mod:`modelyard.stop_signals`)."""
        stop = asyncio.Event()
        watch_stop_signals(asyncio.get_running_loop(), stop, self.settings.drain_timeout_s)
        await self.start()
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            await self.stop()
