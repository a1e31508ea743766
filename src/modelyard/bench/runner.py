"""Runs the phases of a benchmark: closed loop, open loop, sweeps, warm-up and CPU accounting.

Closed loop: ``concurrency`` workers each send, wait, and send again. Open loop: arrivals are
scheduled in advance (Poisson at the target rate, or the trace's timestamps) and handed to
``concurrency`` workers in order; a request's latency runs from its *scheduled* time, so a
slow server cannot slow the schedule down and hide its queueing (coordinated omission).
"""

from __future__ import annotations

import asyncio
import random
import resource
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from modelyard.bench.access import Access
from modelyard.bench.client import AiohttpClient, Endpoint, InferClient, InferSession, RawHttpClient
from modelyard.bench.config import BenchConfig
from modelyard.bench.discovery import discover_rest
from modelyard.bench.errors import BenchConfigError
from modelyard.bench.payload import Payload, payload_from_file, random_payload
from modelyard.bench.report import ProgressLine
from modelyard.bench.results import ERROR_NOT_SENT, BenchResult, Recorder
from modelyard.bench.workload import ModelMix, TraceMix, trace

_NS = 1_000_000_000


@dataclass(frozen=True)
class Workload:
    """The resolved models, the mix over them and one payload per model."""

    mix: ModelMix
    payloads: Mapping[str, Payload]


@dataclass(frozen=True)
class Phase:
    """One point of a sweep."""

    concurrency: int
    rate: float | None
    """Target arrivals per second (open loop), or ``None``."""


async def run_bench(
    config: BenchConfig, *, on_result: Callable[[BenchResult], None] | None = None
) -> list[BenchResult]:
    """Discover the models, build payloads, run every phase and return one result per phase.

    ``on_result`` is called after each phase, e.g. to print a row while the sweep continues.
    Raises :class:`~modelyard.bench.errors.BenchError` when the benchmark cannot run; errors the
    server returns are counted in the results instead.
    """
    workload = await prepare_workload(config)
    results = []
    for phase in phases(config):
        if config.engine == "wrk":
            from modelyard.bench.wrk import run_wrk_phase

            result = await run_wrk_phase(config, workload, phase.concurrency)
        else:
            result = await run_phase(config, workload, phase)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def phases(config: BenchConfig) -> list[Phase]:
    """The sweep: every concurrency level, times every rate in open loop."""
    if not config.rates:
        return [Phase(c, None) for c in config.concurrency]
    return [Phase(c, rate) for rate in config.rates for c in config.concurrency]


async def prepare_workload(config: BenchConfig) -> Workload:
    """Resolve the models (asking the server if needed), the mix and each model's payload."""
    models: tuple[str, ...] = config.models
    if config.mix.kind == "trace":
        assert config.mix.trace_path is not None
        models = trace(config.mix.trace_path).models
    skip = frozenset(config.payload_files)
    access = Access.from_config(config)
    if config.grpc_target is not None:
        from modelyard.bench.grpc_client import discover_grpc

        found = await discover_grpc(
            config.grpc_target,
            models,
            skip_metadata=skip,
            timeout_s=config.request_timeout_s,
            call_metadata=access.grpc_metadata,
            root_certificates=access.grpc_root_certificates(),
        )
    else:
        found = await discover_rest(
            Endpoint.parse(config.url),
            models,
            skip_metadata=skip,
            timeout_s=config.request_timeout_s,
            headers=access.http_headers,
            ssl_context=access.ssl_context(),
        )
    unknown = skip - set(found.models)
    if unknown:
        raise BenchConfigError(f"--payload names models not benchmarked: {sorted(unknown)}")
    payloads = {
        name: payload_from_file(name, config.payload_files[name])
        if name in skip
        else random_payload(found.metadata[name], seed=config.seed)
        for name in found.models
    }
    return Workload(mix=config.mix.build(found.models, config.seed), payloads=payloads)


async def run_phase(config: BenchConfig, workload: Workload, phase: Phase) -> BenchResult:
    """Run one phase with the Python engine."""
    client = _open_client(config, workload, phase.concurrency)
    recorder = Recorder()
    label = f"c={phase.concurrency}" + (f" rate={phase.rate:g}/s" if phase.rate else "")
    progress = ProgressLine(label, lambda: recorder.done) if config.progress else None
    try:
        if progress is not None:
            progress.start()
        start_ns = time.perf_counter_ns()
        plan = _Plan(config, start_ns)
        sessions = [client.session() for _ in range(phase.concurrency)]
        cpu_at_start = asyncio.create_task(_cpu_at(plan.measure_start_ns))
        try:
            async with asyncio.TaskGroup() as group:
                if config.is_open_loop:
                    arrivals = _arrivals(config, workload.mix, phase.rate, start_ns)
                    for session in sessions:
                        group.create_task(_open_worker(session, arrivals, plan, recorder))
                else:
                    models = workload.mix.choices()
                    for session in sessions:
                        group.create_task(_closed_worker(session, models, plan, recorder))
            end_ns = time.perf_counter_ns()
            cpu_end_s = _cpu_s()
            # The phase can end inside warm-up (a short trace); then nothing was measured.
            cpu_start_s = cpu_at_start.result() if cpu_at_start.done() else cpu_end_s
        finally:
            cpu_at_start.cancel()
    finally:
        if progress is not None:
            await progress.stop()
        await client.close()
    return recorder.summarise(
        engine=f"python/{_client_name(config)}",
        mode="open" if config.is_open_loop else "closed",
        concurrency=phase.concurrency,
        target_rate=phase.rate,
        duration_s=max(end_ns - plan.measure_start_ns, 1) / _NS,
        client_cpu_s=max(cpu_end_s - cpu_start_s, 0.0),
    )


class _Plan:
    """The phase's time line, shared by its workers; ``remaining`` counts measured sends."""

    def __init__(self, config: BenchConfig, start_ns: int) -> None:
        self.measure_start_ns = start_ns + int(config.warmup_s * _NS)
        window_s = config.duration_s if config.requests is None else config.max_phase_s
        assert window_s is not None
        self.stop_ns = self.measure_start_ns + int(window_s * _NS)
        self.remaining = config.requests
        self.late_ns = int(config.request_timeout_s * _NS)
        """An arrival sent this late would already have timed out: count it as not sent."""

    def claim(self, started_ns: int) -> bool | None:
        """Whether a send started at ``started_ns`` is measured; ``None`` when the phase is over."""
        if started_ns >= self.stop_ns:
            return None
        if started_ns < self.measure_start_ns:
            return False
        if self.remaining is not None:
            if self.remaining <= 0:
                return None
            self.remaining -= 1
        return True


async def _closed_worker(
    session: InferSession, models: Iterator[str], plan: _Plan, recorder: Recorder
) -> None:
    clock = time.perf_counter_ns
    while True:
        started = clock()
        measured = plan.claim(started)
        if measured is None:
            return
        model = next(models)
        error = await session.infer(model)
        recorder.done += 1
        if measured:
            recorder.record(model, clock() - started, error)


async def _open_worker(
    session: InferSession, arrivals: Iterator[tuple[int, str]], plan: _Plan, recorder: Recorder
) -> None:
    clock = time.perf_counter_ns
    # NOTE: the workers share one arrivals iterator; each next() hands out a distinct arrival,
    # so when every worker is busy the next arrival waits, and its latency shows the wait.
    for scheduled, model in arrivals:
        measured = plan.claim(scheduled)
        if measured is None:
            return
        delay_ns = scheduled - clock()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / _NS)
        elif -delay_ns > plan.late_ns:
            if measured:
                recorder.record(model, 0, ERROR_NOT_SENT)
            continue
        error = await session.infer(model)
        recorder.done += 1
        if measured:
            recorder.record(model, clock() - scheduled, error)


def _arrivals(
    config: BenchConfig, mix: ModelMix, rate: float | None, start_ns: int
) -> Iterator[tuple[int, str]]:
    if rate is None:
        assert isinstance(mix, TraceMix)  # replay_trace_timing, checked by BenchConfig
        return ((start_ns + int(e.offset_s * _NS), e.model) for e in mix.entries)
    return _poisson(start_ns, rate, mix.choices(), config.seed)


def _poisson(
    start_ns: int, rate: float, models: Iterator[str], seed: int
) -> Iterator[tuple[int, str]]:
    rng = random.Random(seed)
    at = float(start_ns)
    for model in models:
        at += rng.expovariate(rate) * _NS
        yield int(at), model


def _client_name(config: BenchConfig) -> str:
    if config.grpc_target is None:
        return config.http_client
    return "grpc"


def _open_client(config: BenchConfig, workload: Workload, concurrency: int) -> InferClient:
    access = Access.from_config(config)
    if config.grpc_target is not None:
        from modelyard.bench.grpc_client import GrpcInferClient

        return GrpcInferClient(
            config.grpc_target,
            workload.payloads,
            timeout_s=config.request_timeout_s,
            metadata=access.grpc_metadata,
            root_certificates=access.grpc_root_certificates(),
        )
    endpoint = Endpoint.parse(config.url)
    bodies = {model: payload.json_body for model, payload in workload.payloads.items()}
    if config.http_client == "aiohttp":
        return AiohttpClient(
            endpoint,
            bodies,
            limit=concurrency,
            timeout_s=config.request_timeout_s,
            headers=access.http_headers,
            ssl_context=access.ssl_context(),
        )
    return RawHttpClient(
        endpoint, bodies, timeout_s=config.request_timeout_s, headers=access.http_headers
    )


async def _cpu_at(at_ns: int) -> float:
    """Sleep until ``at_ns`` (the end of warm-up), then read the process's CPU time."""
    delay_ns = at_ns - time.perf_counter_ns()
    if delay_ns > 0:
        await asyncio.sleep(delay_ns / _NS)
    return _cpu_s()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
