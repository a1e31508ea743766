"""Predictive preloading: what to load before anyone asks, and what it may displace.

Two predictors. A first-order Markov chain over the server-wide stream of requested
models: every request for ``A`` followed by one for ``B`` counts one ``A → B``
transition, and after a request for ``A`` the most likely successor is the candidate.
And per-model arrival histograms (as in "Serverless in the Wild", Shahrad et al.
ATC '20): the distribution of gaps between a model's requests, from which the chance
that a model is asked for within a horizon, given how long it has been idle, follows.

A predicted model is loaded into free budget when it fits. When it does not (the
budget is never free under pressure), it may displace resident models, but only idle,
unpinned models outside the top decile of demand, and only when its expected value
beats what displacing them costs: ``p * reload seconds`` of the prediction (``p`` its
probability) against ``1 - p`` (a right guess's own request would evict the same
victims) times the sum of ``P(use within horizon) * reload seconds`` over the victims
(their P from their histograms). See docs/caching.md.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from modelyard.config.settings import PrefetchConfig
from modelyard.errors import ServerError
from modelyard.manager.eviction import ArrivalCostPolicy, EvictionPolicy, reload_seconds
from modelyard.manager.prewarm import PrewarmWindows
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model expected next, with its estimated probability."""

    model: str
    probability: float
    observations: int
    sole: bool = False
    """The only successor its source has had, and such sole successors have lately
    proved right (see :meth:`MarkovPredictor.sole_reliable`)."""
    prewarm: bool = False
    """From the model's own idle times (its pre-warm window is opening), not a transition."""


@dataclass(frozen=True, slots=True)
class PrefetchDecision:
    """Load ``target`` now; evict ``victims`` first (empty: it fits in free budget)."""

    target: ModelRecord
    guess: Prediction
    victims: list[ModelRecord] = field(default_factory=list)
    gain: float = 0.0
    """Expected reload seconds saved: the target's value less the victims' (0 if free)."""
    load: bool = True
    """False: it cannot be loaded now; only warm its files in the page cache."""


PREWARM_LOAD_FACTOR = 2.0
PREWARM_MARGIN_S = 0.25
"""A model is pre-warmed its load time times the factor, plus the margin, before its
window opens (a load may queue behind others for a slot; the margin covers the server's
look every ``anticipation.PREWARM_TICK_S``). Every second early is a second the model
holds memory others are loaded into: with a 1-s margin a quarter of the live pre-warms
were evicted before their request (session 10, BENCHMARKS.md §17)."""

SOLE_TRACK = 50
"""How many recent tests of sole successors :meth:`MarkovPredictor.sole_reliable` weighs."""
SOLE_MIN_TRIALS = 10
"""... and how many it needs before it trusts them at all."""


class MarkovPredictor:
    """Counts transitions between consecutively requested models. Pure; no I/O.

    It also keeps a track record of *sole successors*: each time a model whose every
    transition so far went to one successor is requested, whether the request after it
    was that successor. On a stream of pipelines (A, then B, then C) they almost always
    are; on independent requests almost never (two requests in a row for a model are
    followed by the same one with the chance of drawing one model twice). When the
    record is good, a prediction from a sole successor can be trusted after fewer
    sightings than ``min_observations`` (:class:`Prefetcher`), which is what a short
    run of pipelines spends learning.
    """

    def __init__(self, *, max_models: int = 10_000) -> None:
        self._transitions: dict[str, Counter[str]] = defaultdict(Counter)
        self._last: str | None = None
        self._max_models = max_models
        self._sole_record: deque[bool] = deque(maxlen=SOLE_TRACK)
        self.sole_threshold = 0.6
        """How often sole successors must have been right (the prefetcher sets its
        ``min_probability``)."""

    def observe(self, model: str) -> None:
        """Record a request for ``model``."""
        last, self._last = self._last, model
        if last is None or last == model:
            return
        seen = self._transitions.get(last)
        if seen is not None and len(seen) == 1:
            self._sole_record.append(model in seen)
        if last not in self._transitions and len(self._transitions) >= self._max_models:
            return  # bounded memory: stop learning about new sources
        self._transitions[last][model] += 1

    def predict(self, model: str) -> Prediction | None:
        """The most likely successor of ``model`` (None when nothing was seen)."""
        counts = self._transitions.get(model)
        if not counts:
            return None
        total = sum(counts.values())
        # most_common(1) is this max (heapq.nlargest takes max for one), without its
        # two Python layers: it runs after every run of requests.
        successor, n = max(counts.items(), key=itemgetter(1))
        sole = len(counts) == 1 and self.sole_reliable(self.sole_threshold)
        return Prediction(successor, n / total, total, sole)

    def sole_reliable(self, threshold: float = 0.6) -> bool:
        """Whether sole successors proved right at least ``threshold`` of the last
        :data:`SOLE_TRACK` times they were tested (and were tested often enough)."""
        record = self._sole_record
        return len(record) >= SOLE_MIN_TRIALS and sum(record) >= threshold * len(record)


# Gap bins: 0.05 s to about 4 hours, each a third wider than the last (≈ 45 bins).
_EDGES = [0.05 * (4 / 3) ** i for i in range(45)]


@dataclass
class _Arrivals:
    first: float
    last: float
    count: int = 1
    gaps: list[int] = field(default_factory=lambda: [0] * (len(_EDGES) + 1))


class ArrivalHistograms:
    """Per-model histograms of the gaps between requests (keep-alive windows).

    Bounded: ``max_models`` models, each a fixed array of log-spaced bins.
    """

    def __init__(self, *, max_models: int = 10_000, min_gaps: int = 5) -> None:
        self._models: dict[str, _Arrivals] = {}
        self._max_models = max_models
        self._min_gaps = min_gaps

    def observe(self, model: str, now: float) -> None:
        """Record a request for ``model`` at ``now``."""
        self.observe_run(model, (now,))

    def observe_run(self, model: str, times: Sequence[float]) -> None:
        """:meth:`observe` for consecutive requests for ``model`` at ``times``, in order."""
        a = self._models.get(model)
        if a is None:
            if len(self._models) >= self._max_models:
                return
            a = self._models[model] = _Arrivals(times[0], times[0])
            times = times[1:]
            if not times:
                return
        last, bins, edges, find = a.last, a.gaps, _EDGES, bisect.bisect_left
        for now in times:
            bins[find(edges, now - last)] += 1
            last = now
        a.last = last
        a.count += len(times)

    def p_within(self, model: str, now: float, horizon_s: float) -> float:
        """P(``model`` is asked for within ``horizon_s`` of ``now``), given its idle time.

        From the histogram, ``P(gap ≤ idle + h | gap > idle)``; with fewer than
        ``min_gaps`` gaps seen, a Poisson guess from its mean rate; 0 for a model never
        seen.
        """
        a = self._models.get(model)
        if a is None:
            return 0.0
        idle = max(0.0, now - a.last)
        seen = sum(a.gaps)
        if seen < self._min_gaps:
            span = max(now - a.first, horizon_s)
            return 1.0 - math.exp(-horizon_s * a.count / span)
        lo = bisect.bisect_left(_EDGES, idle)
        hi = bisect.bisect_right(_EDGES, idle + horizon_s)
        beyond = sum(a.gaps[lo:])
        if beyond == 0:
            return 0.0  # idle longer than any gap seen: it has probably gone cold
        return min(1.0, sum(a.gaps[lo : hi + 1]) / beyond)


class Prefetcher:
    """Decides, after each request, whether one model should be loaded ahead of need.

    The decision only: the manager (or the simulator) starts the load and evicts the
    victims it names. ``victims(target, missing)`` returns the eviction plan that would
    free ``missing`` bytes: idle, unpinned candidates outside the hot decile, in the
    policy's order (None: none would do). Without it a prefetch never evicts.
    """

    def __init__(
        self,
        config: PrefetchConfig,
        resolve: Callable[[str], ModelRecord],
        free_bytes: Callable[[ModelRecord], int],
        estimate_bytes: Callable[[ModelRecord], int],
        predictor: MarkovPredictor | None = None,
        *,
        victims: Callable[[ModelRecord, int], Sequence[ModelRecord] | None] | None = None,
        histograms: ArrivalHistograms | None = None,
    ) -> None:
        self._config = config
        self._resolve = resolve
        self._free_bytes = free_bytes
        self._estimate_bytes = estimate_bytes
        self._victims = victims
        self.predictor = predictor or MarkovPredictor()
        self.predictor.sole_threshold = config.min_probability
        self.histograms = histograms or ArrivalHistograms()
        self.windows = PrewarmWindows()
        """Per-model idle times: models whose pre-warm window is opening (timers)."""

    def pair(self, policy: EvictionPolicy) -> None:
        """Tell ``policy`` (when it is ``arrival-cost``) which models will be pre-warmed
        before their next request (evicted first until then, kept while due)."""
        if self._config.enabled and self._config.prewarm and isinstance(policy, ArrivalCostPolicy):
            policy.prewarm_factor = self.windows.factor

    def after(
        self,
        model: str,
        now: float = 0.0,
        *,
        also_needed: int = 0,
        turnover_s: Callable[[], float] | None = None,
    ) -> PrefetchDecision | None:
        """Note a request for ``model`` at ``now``; what is worth loading now, if anything.

        ``also_needed``: bytes the request's own model is about to take (it is cold and
        holds no reservation yet); room is made for both, or the request's load would
        take the room made for the prediction, and the prediction be refused.
        ``turnover_s``: how long an idle model stays resident now (the longest idle
        time among resident models); a victim asked for only later would have been
        evicted before its use anyway, so its expected reload is taken over at most
        that long instead of ``horizon_s``.
        """
        return self.after_run(model, (now,), also_needed=also_needed, turnover_s=turnover_s)

    def after_run(
        self,
        model: str,
        times: Sequence[float],
        *,
        also_needed: int = 0,
        turnover_s: Callable[[], float] | None = None,
    ) -> PrefetchDecision | None:
        """:meth:`after` for consecutive requests for ``model`` at ``times`` (ascending):
        the predictors learn each request, in order; the decision is taken once, after
        the last (``also_needed`` is that request's).

        The state learnt is exactly that of one :meth:`after` per request. The decision
        is the last one's: after the earlier requests of a run, the chain predicts the
        same successor, and an action on it would have left the target loading (no
        decision after) or its files warmed (at most once in 30 s).
        """
        cfg = self._config
        if not cfg.enabled:
            return None
        self.predictor.observe(model)  # the run's later requests repeat it: no transition
        self.histograms.observe_run(model, times)
        if cfg.prewarm:
            self.windows.observe_run(model, times, self._lead_s)
        now = times[-1]
        decision = self._markov(model, now, also_needed, turnover_s)
        if cfg.prewarm and (decision is None or not decision.load):
            decision = self._prewarm(now, also_needed, turnover_s) or decision
        return decision

    def tick(
        self, now: float, *, turnover_s: Callable[[], float] | None = None
    ) -> PrefetchDecision | None:
        """A model whose pre-warm window is opening, with no request to follow: a quiet
        server (a timer's model is due whether or not anything else is asked for)."""
        cfg = self._config
        if not (cfg.enabled and cfg.prewarm):
            return None
        return self._prewarm(now, 0, turnover_s)

    def _lead_s(self, model: str) -> float:
        """How long before its window a model is pre-warmed: its load, twice (a load may
        queue for a slot behind others), and :data:`PREWARM_MARGIN_S`."""
        try:
            record = self._resolve(model)
        except ServerError:
            return PREWARM_MARGIN_S
        return PREWARM_LOAD_FACTOR * reload_seconds(record) + PREWARM_MARGIN_S

    def _markov(
        self,
        model: str,
        now: float,
        also_needed: int,
        turnover_s: Callable[[], float] | None,
    ) -> PrefetchDecision | None:
        cfg = self._config
        guess = self.predictor.predict(model)
        if (
            guess is None
            or guess.probability < cfg.min_probability
            or guess.observations
            < (
                min(cfg.sole_observations, cfg.min_observations)
                if guess.sole
                else cfg.min_observations
            )
        ):
            return None
        try:
            target = self._resolve(guess.model)
        except ServerError:
            return None  # not (or no longer) in the repository, or no version to serve
        return self._decide(target, guess, now, also_needed, turnover_s)

    def _prewarm(
        self,
        now: float,
        also_needed: int,
        turnover_s: Callable[[], float] | None,
    ) -> PrefetchDecision | None:
        """The first model whose pre-warm window is opening that is worth loading now."""
        for window in self.windows.due(now):
            if window.probability < self._config.min_probability:
                continue
            try:
                target = self._resolve(window.model)
            except ServerError:
                self.windows.done(window.model)
                continue
            loading = target.load_task is not None and not target.load_task.done()
            if target.state is not ModelState.UNLOADED or loading:
                self.windows.done(window.model)  # resident or loading already
                continue
            guess = Prediction(window.model, window.probability, window.gaps, prewarm=True)
            decision = self._decide(target, guess, now, also_needed, turnover_s)
            if decision is not None and decision.load:
                self.windows.done(window.model)
                return decision
        return None

    def _decide(
        self,
        target: ModelRecord,
        guess: Prediction,
        now: float,
        also_needed: int,
        turnover_s: Callable[[], float] | None,
    ) -> PrefetchDecision | None:
        """Load ``target`` into free budget, displace victims worth less, or only warm its
        files (None: it is resident or loading already)."""
        cfg = self._config
        if target.state is not ModelState.UNLOADED or (
            target.load_task is not None and not target.load_task.done()
        ):
            return None
        free = self._free_bytes(target)
        missing = self._estimate_bytes(target) + also_needed - free
        if missing <= 0:
            return PrefetchDecision(target, guess)
        plan = self._victims(target, missing) if cfg.displace and self._victims else None
        if plan:
            horizon = cfg.horizon_s if turnover_s is None else min(cfg.horizon_s, turnover_s())
            # If the guess is right, the target's own request would evict these victims
            # a moment later anyway (its load needs the same room, and the policy would
            # pick the same idle models): displacing them now costs their expected
            # reload only when the guess is wrong. Charging it in full compared the
            # prefetch with never loading the target at all, and on a live pipeline a
            # certain successor lost to two victims due back within seconds.
            p = guess.probability
            gain = self.value(target, p) - (1.0 - p) * sum(
                self.value(v, self.histograms.p_within(v.key.name, now, horizon))
                for v in self._charged(target, plan, also_needed - free)
            )
            if gain > 0:
                return PrefetchDecision(target, guess, list(plan), gain)
        # It cannot be loaded now: its files can still wait in the page cache.
        return PrefetchDecision(target, guess, load=False) if cfg.page_cache else None

    def _charged(
        self, target: ModelRecord, plan: Sequence[ModelRecord], own_missing: int
    ) -> list[ModelRecord]:
        """The victims of ``plan`` the prediction is to blame for.

        Those that the cold request's own load needs (``own_missing`` bytes, the first
        in the policy's order) leave for that load whether or not anything is prefetched,
        so they cost the prediction nothing; charging them made a cold request's
        successor almost never worth loading (issue 16, live sequence run).
        """
        if own_missing <= 0 or self._victims is None:
            return list(plan)
        own = self._victims(target, own_missing)
        if not own:
            return list(plan)
        return [v for v in plan if all(v is not o for o in own)]

    @staticmethod
    def value(record: ModelRecord, probability: float) -> float:
        """Expected reload seconds of not having ``record`` resident: ``P * reload``."""
        return probability * reload_seconds(record)
