"""Request traces: who asks for which model when, and what each model costs to load.

A trace is a time-ordered list of :class:`Request` plus a :class:`ModelSpec` per model
(its size in bytes and its reload time). Reload times come from per-runtime
:class:`LoadCurve` (a fixed part plus seconds per MiB); the ONNX curve is fitted to the
cold-start benchmark (BENCHMARKS.md §2: 25.6 ms at 1 MB, 130 ms at 50 MB, 627 ms at
200 MB). Every generator is deterministic for a given seed.

Synthetic shapes: Zipf popularity (:func:`zipf`), bursts from a Markov-modulated Poisson
process (:func:`bursty`), a day/night cycle (:func:`diurnal`), pipelines where model A
is followed by B then C (:func:`pipeline`), and a mix shaped after the Azure Functions
2019 trace statistics (:func:`azure_like`).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    """One request: when (seconds from the trace's start) and for which model."""

    t: float
    model: str


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What a model costs: bytes it holds when loaded, seconds to load it."""

    name: str
    size_bytes: int
    load_s: float


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """Load time against size for one runtime: ``fixed_s + s_per_mib * MiB``."""

    runtime: str
    fixed_s: float
    s_per_mib: float

    def load_s(self, size_bytes: int) -> float:
        """Seconds to load a model of ``size_bytes``."""
        return self.fixed_s + self.s_per_mib * size_bytes / MIB


LOAD_CURVES = {
    # Fitted to BENCHMARKS.md §2 (ONNX MLPs, process isolation, warm page cache).
    "onnx": LoadCurve("onnx", 0.020, 0.0030),
    # Pickled estimators: unpickling is slower per byte than mapping ONNX weights.
    "sklearn": LoadCurve("sklearn", 0.030, 0.0040),
    # torch and arbitrary Python models pay an import of several hundred ms first.
    "torch": LoadCurve("torch", 0.450, 0.0025),
    "python": LoadCurve("python", 0.300, 0.0030),
}
"""Per-runtime load curves; only ``onnx`` is measured here, the others are estimates."""


@dataclass(frozen=True, slots=True)
class Trace:
    """A named request trace and the models it asks for."""

    name: str
    requests: list[Request]
    models: dict[str, ModelSpec]
    load_slots: int | None = None
    """The load slots of the server that recorded it (its request log says; None: unknown)."""

    @property
    def duration_s(self) -> float:
        """Seconds from the first request to the last."""
        return self.requests[-1].t - self.requests[0].t if self.requests else 0.0

    @property
    def total_bytes(self) -> int:
        """Bytes of every model together."""
        return sum(m.size_bytes for m in self.models.values())


def heterogeneous_models(n: int, seed: int = 0, prefix: str = "m") -> dict[str, ModelSpec]:
    """``n`` models of 5-200 MiB on mixed runtimes (a fifth of them slow to start)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        size = rng.choice([5, 10, 20, 50, 100, 200]) * MIB
        runtime = "python" if rng.random() < 0.2 else rng.choice(["onnx", "onnx", "sklearn"])
        name = f"{prefix}{i:03d}"
        out[name] = ModelSpec(name, size, LOAD_CURVES[runtime].load_s(size))
    return out


def uniform_models(n: int, size_mib: float = 10, prefix: str = "m") -> dict[str, ModelSpec]:
    """``n`` ONNX models of one size (where Belady's MIN is exactly optimal)."""
    size = int(size_mib * MIB)
    load_s = LOAD_CURVES["onnx"].load_s(size)
    return {f"{prefix}{i:03d}": ModelSpec(f"{prefix}{i:03d}", size, load_s) for i in range(n)}


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def _poisson_times(n: int, rate: float, rng: random.Random) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def zipf(
    models: dict[str, ModelSpec],
    n_requests: int,
    s: float,
    *,
    rate: float = 5.0,
    seed: int = 0,
) -> Trace:
    """Poisson arrivals at ``rate`` per second, models drawn by Zipf(``s``) popularity.

    Popularity ranks are shuffled against the model order, so size and rank are
    independent.
    """
    rng = random.Random(seed)
    names = list(models)
    rng.shuffle(names)
    weights = _zipf_weights(len(names), s)
    times = _poisson_times(n_requests, rate, rng)
    picks = rng.choices(names, weights, k=n_requests)
    return Trace(f"zipf-{s:g}", [Request(t, m) for t, m in zip(times, picks, strict=True)], models)


def bursty(
    models: dict[str, ModelSpec],
    n_requests: int,
    *,
    s: float = 1.1,
    calm_rate: float = 2.0,
    burst_rate: float = 40.0,
    mean_calm_s: float = 20.0,
    mean_burst_s: float = 2.0,
    seed: int = 0,
) -> Trace:
    """A two-state Markov-modulated Poisson process: calm spells and bursts.

    During a burst most requests go to one model picked for that burst (a batch job
    hitting one model); calm spells follow Zipf(``s``).
    """
    rng = random.Random(seed)
    names = list(models)
    rng.shuffle(names)
    weights = _zipf_weights(len(names), s)
    out: list[Request] = []
    t, burst = 0.0, False
    until = rng.expovariate(1 / mean_calm_s)
    focus = names[0]
    while len(out) < n_requests:
        rate = burst_rate if burst else calm_rate
        t += rng.expovariate(rate)
        if t >= until:
            burst = not burst
            until = t + rng.expovariate(1 / (mean_burst_s if burst else mean_calm_s))
            focus = rng.choices(names, weights)[0] if burst else focus
            continue
        if burst and rng.random() < 0.8:
            out.append(Request(t, focus))
        else:
            out.append(Request(t, rng.choices(names, weights)[0]))
    return Trace("bursty", out, models)


def diurnal(
    models: dict[str, ModelSpec],
    n_requests: int,
    *,
    s: float = 1.1,
    day_s: float = 600.0,
    mean_rate: float = 5.0,
    seed: int = 0,
) -> Trace:
    """Rate following a day/night sine (peak 4 times the trough); two popularity sets that swap.

    Half of the models are popular by day and the other half by night, so a policy must
    forget the night's favourites by morning.
    """
    rng = random.Random(seed)
    names = list(models)
    rng.shuffle(names)
    day_set, night_set = names[: len(names) // 2], names[len(names) // 2 :]
    day_w, night_w = _zipf_weights(len(day_set), s), _zipf_weights(len(night_set), s)
    out: list[Request] = []
    t = 0.0
    peak = mean_rate * 1.6
    while len(out) < n_requests:
        # Thinning: candidates at the peak rate, kept with probability rate(t) / peak.
        t += rng.expovariate(peak)
        phase = math.sin(2 * math.pi * t / day_s)
        rate = mean_rate * (1 + 0.6 * phase)
        if rng.random() * peak > rate:
            continue
        daytime = phase >= 0
        pool, w = (day_set, day_w) if daytime else (night_set, night_w)
        # A fifth of the traffic ignores the clock.
        if rng.random() < 0.2:
            pool, w = names, _zipf_weights(len(names), s)
        out.append(Request(t, rng.choices(pool, w)[0]))
    return Trace("diurnal", out, models)


def pipeline(
    models: dict[str, ModelSpec],
    n_sessions: int,
    *,
    length: int = 3,
    gap_s: float = 0.5,
    session_rate: float = 0.5,
    seed: int = 0,
) -> Trace:
    """Pipelines: each session runs a fixed chain (A, then B, then C), ``gap_s`` apart.

    The models are cut into chains of ``length``; sessions pick a chain by Zipf(1.0) and
    arrive as a Poisson process. Sessions do not overlap, so the chains are visible in
    the request stream (what a Markov predictor can learn).
    """
    rng = random.Random(seed)
    names = list(models)
    rng.shuffle(names)
    chains = [names[i : i + length] for i in range(0, len(names) - length + 1, length)]
    weights = _zipf_weights(len(chains), 1.0)
    out: list[Request] = []
    t = 0.0
    for _ in range(n_sessions):
        t += rng.expovariate(session_rate) + gap_s * length
        chain = rng.choices(chains, weights)[0]
        for k, m in enumerate(chain):
            out.append(Request(t + k * gap_s, m))
    out.sort(key=lambda r: r.t)
    return Trace("pipeline", out, models)


def azure_like(
    models: dict[str, ModelSpec],
    duration_s: float,
    *,
    seed: int = 0,
) -> Trace:
    """Arrivals shaped after the Azure Functions 2019 trace (Shahrad et al., ATC '20).

    Published figures it follows: invocation rates span about eight orders of magnitude
    and are roughly log-normal across functions (here: log10 of the mean rate uniform
    between -4.5 and -0.5 per second, i.e. about one call in nine hours to one every
    three seconds: the busiest decades are cut so that a host of two cores keeps up);
    45 % of applications are called at most once an hour on average; about 20 % of
    functions are timer-triggered (near-periodic arrivals, small jitter); the rest
    have bursty inter-arrival times (coefficient of variation above 1, drawn here as
    log-normal gaps with sigma 1.5).
    """
    rng = random.Random(seed)
    out: list[Request] = []
    for name in models:
        log_rate = rng.uniform(-4.5, -0.5)
        rate = 10**log_rate
        timer = rng.random() < 0.2
        t = rng.uniform(0, 1 / rate) if timer else 0.0
        sigma = 1.5
        # A log-normal gap with mean 1 / rate: mu = ln(1 / rate) - sigma² / 2.
        mu = math.log(1 / rate) - sigma * sigma / 2
        while True:
            if timer:
                t += (1 / rate) * rng.uniform(0.98, 1.02)
            else:
                t += rng.lognormvariate(mu, sigma)
            if t >= duration_s:
                break
            out.append(Request(t, name))
    out.sort(key=lambda r: r.t)
    return Trace("azure-2019", out, models)


def standard_traces(seed: int = 0, n_models: int = 100, n_requests: int = 20_000) -> list[Trace]:
    """The standard set the benchmark runs (rates a two-core host keeps up with at a
    budget of a fifth of the models: about 5 requests a second)."""
    models = heterogeneous_models(n_models, seed)
    return [
        zipf(models, n_requests, 0.8, seed=seed),
        zipf(models, n_requests, 1.1, seed=seed),
        zipf(models, n_requests, 1.4, seed=seed),
        bursty(models, n_requests, seed=seed),
        diurnal(models, n_requests, seed=seed),
        pipeline(models, n_requests // 3, seed=seed),
        azure_like(models, 3600.0, seed=seed),
    ]


# ---------------------------------------------------------------- request logs


def read_request_log(
    path: Path, *, default_runtime: str = "onnx", default_size_mib: float = 50.0
) -> Trace:
    """A trace from a server's request log (JSON lines; ``request_log`` in the settings).

    Lines ``{"t": s, "model": name}`` are requests; ``{"t": s, "model": name, "event":
    "load", "bytes": n, "load_s": s}`` record a finished load: the last size becomes the
    model's, the median of its load times its reload time (one load slowed by a busy host
    would otherwise set every replayed one). A model never seen loading gets
    ``default_size_mib`` and the load curve of ``default_runtime``. Lines that are not
    valid JSON objects of that shape are skipped (a log cut off mid-line still reads).
    The server's ``load_slots``, from the line a server writes when it opens the log (the
    last such line), becomes the trace's.
    """
    requests: list[Request] = []
    slots: int | None = None
    sizes: dict[str, int] = {}
    load_times: dict[str, list[float]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
                if row.get("event") == "start":
                    slots = max(0, int(row["load_slots"]))
                    continue
                t = float(row["t"])
                model = str(row["model"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            if row.get("event") == "load":
                try:
                    size, load_s = int(row["bytes"]), float(row["load_s"])
                except (ValueError, KeyError, TypeError):
                    continue
                sizes[model] = size
                load_times.setdefault(model, []).append(load_s)
            else:
                requests.append(Request(t, model))
    requests.sort(key=lambda r: r.t)
    seen = {m: ModelSpec(m, sizes[m], statistics.median(load_times[m])) for m in sizes}
    curve = LOAD_CURVES[default_runtime]
    size = int(default_size_mib * MIB)
    models = {
        name: seen.get(name, ModelSpec(name, size, curve.load_s(size)))
        for name in dict.fromkeys(r.model for r in requests)
    }
    return Trace(path.stem, requests, models, slots)


def write_trace(trace: Trace, path: Path) -> None:
    """Write ``trace`` in the request-log format (loads first, then requests)."""
    with path.open("w", encoding="utf-8") as f:
        for m in trace.models.values():
            row = {"t": 0.0, "model": m.name, "event": "load"}
            f.write(json.dumps(row | {"bytes": m.size_bytes, "load_s": m.load_s}) + "\n")
        for r in trace.requests:
            f.write(json.dumps({"t": r.t, "model": r.model}) + "\n")


def names_of(requests: Iterable[Request]) -> Sequence[str]:
    """The models a request list asks for, in order of first appearance."""
    return list(dict.fromkeys(r.model for r in requests))
