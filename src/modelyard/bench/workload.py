"""Which model each request goes to: uniform, Zipf-skewed, or replayed from a trace.

A mix is a frozen description; :meth:`ModelMix.choices` returns a fresh, endless iterator, so
two runs with the same seed send the same sequence of models. Choices are drawn in blocks
with ``random.choices`` because the load generator calls ``next()`` once per request and
must stay cheap.
"""

from __future__ import annotations

import csv
import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from modelyard.bench.errors import BenchConfigError

_BLOCK = 1024
"""How many choices one ``random.choices`` call draws."""


class ModelMix(Protocol):
    """A deterministic source of model names, one per request."""

    @property
    def models(self) -> tuple[str, ...]:
        """Every model the mix may choose, most popular first where that applies."""
        ...

    def choices(self) -> Iterator[str]:
        """A fresh, endless iterator of model names; equal mixes yield equal sequences."""
        ...


@dataclass(frozen=True)
class UniformMix:
    """Each request picks a model uniformly at random."""

    models: tuple[str, ...]
    seed: int = 0

    def choices(self) -> Iterator[str]:
        """Endless uniform choices, reproducible from ``seed``."""
        rng = random.Random(self.seed)
        if len(self.models) == 1:
            return itertools.repeat(self.models[0])
        return _blocks(lambda: rng.choices(self.models, k=_BLOCK))


@dataclass(frozen=True)
class ZipfMix:
    """The model of rank k (1-based, in ``models`` order) is chosen with weight ``1 / k**s``."""

    models: tuple[str, ...]
    s: float = 1.1
    seed: int = 0

    def weights(self) -> tuple[float, ...]:
        """Normalised probability of each model, in ``models`` order."""
        raw = [1.0 / rank**self.s for rank in range(1, len(self.models) + 1)]
        total = sum(raw)
        return tuple(w / total for w in raw)

    def choices(self) -> Iterator[str]:
        """Endless Zipf-distributed choices, reproducible from ``seed``."""
        rng = random.Random(self.seed)
        cumulative = list(itertools.accumulate(self.weights()))
        return _blocks(lambda: rng.choices(self.models, cum_weights=cumulative, k=_BLOCK))


@dataclass(frozen=True)
class TraceEntry:
    """One request of a recorded trace."""

    offset_s: float
    """Seconds after the trace's first request."""
    model: str


@dataclass(frozen=True)
class TraceMix:
    """Replays the model sequence of a recorded trace, cycling when it runs out.

    In an open-loop run with trace timing, the runner also replays ``offset_s`` as send times.
    """

    entries: tuple[TraceEntry, ...]

    @property
    def models(self) -> tuple[str, ...]:
        """Distinct models in order of first appearance."""
        return tuple(dict.fromkeys(entry.model for entry in self.entries))

    def choices(self) -> Iterator[str]:
        """The trace's models in order, repeated forever."""
        return itertools.cycle([entry.model for entry in self.entries])


def uniform(models: Sequence[str], seed: int = 0) -> UniformMix:
    """A mix that spreads requests evenly over ``models``."""
    return UniformMix(_checked(models), seed)


def zipf(models: Sequence[str], s: float = 1.1, seed: int = 0) -> ZipfMix:
    """A mix skewed towards the first models: rank k gets weight ``1 / k**s`` (``s > 0``)."""
    if not s > 0:
        raise BenchConfigError(f"zipf exponent must be > 0, got {s}")
    return ZipfMix(_checked(models), s, seed)


def trace(path: Path | str) -> TraceMix:
    """Load a trace from a CSV of ``timestamp_s,model`` rows (header and ``#`` comments optional).

    Rows are sorted by timestamp; offsets are relative to the earliest one.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchConfigError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    rows: list[tuple[float, str]] = []
    for line_no, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) != 2:
            raise BenchConfigError(f"{path}:{line_no}: expected 'timestamp_s,model', got {row}")
        stamp, model = row[0].strip(), row[1].strip()
        try:
            seconds = float(stamp)
        except ValueError:
            if not rows and stamp.lower().startswith("timestamp"):
                continue  # header row
            raise BenchConfigError(f"{path}:{line_no}: bad timestamp {stamp!r}") from None
        if not model:
            raise BenchConfigError(f"{path}:{line_no}: empty model name")
        rows.append((seconds, model))
    if not rows:
        raise BenchConfigError(f"trace {path} has no requests")
    rows.sort(key=lambda r: r[0])
    first = rows[0][0]
    return TraceMix(tuple(TraceEntry(seconds - first, model) for seconds, model in rows))


@dataclass(frozen=True)
class MixSpec:
    """A mix named on the command line before the model list is known.

    ``uniform``, ``zipf:S`` (``zipf`` alone means ``s = 1.1``) or ``trace:FILE``.
    """

    kind: Literal["uniform", "zipf", "trace"] = "uniform"
    zipf_s: float = 1.1
    trace_path: Path | None = None

    @classmethod
    def parse(cls, text: str) -> MixSpec:
        """Parse ``uniform``, ``zipf[:S]`` or ``trace:FILE``."""
        kind, _, arg = text.partition(":")
        kind = kind.strip().lower()
        if kind == "uniform" and not arg:
            return cls()
        if kind == "zipf":
            try:
                s = float(arg) if arg else 1.1
            except ValueError:
                raise BenchConfigError(f"bad zipf exponent in --mix {text!r}") from None
            if not s > 0:
                raise BenchConfigError(f"zipf exponent must be > 0 in --mix {text!r}")
            return cls(kind="zipf", zipf_s=s)
        if kind == "trace" and arg:
            return cls(kind="trace", trace_path=Path(arg))
        raise BenchConfigError(f"--mix must be uniform, zipf:S or trace:FILE, got {text!r}")

    def build(self, models: Sequence[str], seed: int = 0) -> ModelMix:
        """The mix over ``models`` (ignored for a trace, which names its own)."""
        if self.kind == "trace":
            assert self.trace_path is not None  # parse() guarantees it
            return trace(self.trace_path)
        if self.kind == "zipf":
            return zipf(models, self.zipf_s, seed)
        return uniform(models, seed)


def _checked(models: Sequence[str]) -> tuple[str, ...]:
    names = tuple(models)
    if not names:
        raise BenchConfigError("a mix needs at least one model")
    return names


def _blocks(draw: Callable[[], list[str]]) -> Iterator[str]:
    while True:
        yield from draw()
