"""Predictive preloading: a first-order Markov chain over the stream of requested models.

Every request for model ``A`` followed (in the server-wide stream) by a request for
``B`` counts one ``A → B`` transition. After a request for ``A``, the most likely next
model, if its probability and evidence pass the thresholds and it is not resident, is
loaded in the background, but only into free budget: a prefetch never evicts anything.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from modelyard.config.settings import PrefetchConfig
from modelyard.errors import ServerError
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model expected next, with its estimated probability."""

    model: str
    probability: float
    observations: int


class MarkovPredictor:
    """Counts transitions between consecutively requested models. Pure; no I/O."""

    def __init__(self, *, max_models: int = 10_000) -> None:
        self._transitions: dict[str, Counter[str]] = defaultdict(Counter)
        self._last: str | None = None
        self._max_models = max_models

    def observe(self, model: str) -> None:
        """Record a request for ``model``."""
        last, self._last = self._last, model
        if last is None or last == model:
            return
        if last not in self._transitions and len(self._transitions) >= self._max_models:
            return  # bounded memory: stop learning about new sources
        self._transitions[last][model] += 1

    def predict(self, model: str) -> Prediction | None:
        """The most likely successor of ``model`` (None when nothing was seen)."""
        counts = self._transitions.get(model)
        if not counts:
            return None
        total = sum(counts.values())
        successor, n = counts.most_common(1)[0]
        return Prediction(successor, n / total, total)


class Prefetcher:
    """Decides, after each request, whether one model should be loaded ahead of need.

    The decision only: the manager starts the load (into free budget, never evicting).
    """

    def __init__(
        self,
        config: PrefetchConfig,
        resolve: Callable[[str], ModelRecord],
        free_bytes: Callable[[ModelRecord], int],
        estimate_bytes: Callable[[ModelRecord], int],
        predictor: MarkovPredictor | None = None,
    ) -> None:
        self._config = config
        self._resolve = resolve
        self._free_bytes = free_bytes
        self._estimate_bytes = estimate_bytes
        self.predictor = predictor or MarkovPredictor()

    def after(self, model: str) -> tuple[ModelRecord, Prediction] | None:
        """Note a request for ``model``; the record worth loading now, if any."""
        cfg = self._config
        if not cfg.enabled:
            return None
        self.predictor.observe(model)
        guess = self.predictor.predict(model)
        if (
            guess is None
            or guess.probability < cfg.min_probability
            or guess.observations < cfg.min_observations
        ):
            return None
        try:
            target = self._resolve(guess.model)
        except ServerError:
            return None  # not (or no longer) in the repository, or no version to serve
        if target.state is not ModelState.UNLOADED or (
            target.load_task is not None and not target.load_task.done()
        ):
            return None
        if self._estimate_bytes(target) > self._free_bytes(target):
            return None  # a prefetch never evicts
        return target, guess
