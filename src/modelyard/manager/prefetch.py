"""Predictive preloading: a first-order Markov chain over the stream of requested models.

Every request for model ``A`` followed (in the server-wide stream) by a request for
``B`` counts one ``A → B`` transition. After a request for ``A``, the most likely next
model, if its probability and evidence pass the thresholds and it is not resident, is
loaded in the background, but only into free budget: a prefetch never evicts anything.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass


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
