"""The Markov predictor behind predictive preloading."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import PrefetchConfig
from modelyard.errors import ModelNotFoundError
from modelyard.manager.prefetch import MarkovPredictor, Prefetcher
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState


def test_learns_the_usual_successor() -> None:
    p = MarkovPredictor()
    for _ in range(8):
        p.observe("a")
        p.observe("b")
    p.observe("a")
    p.observe("c")
    pred = p.predict("a")
    assert pred is not None
    assert pred.model == "b"
    assert pred.probability == pytest.approx(8 / 9)
    assert pred.observations == 9


def test_repeats_and_unknown_models_predict_nothing() -> None:
    p = MarkovPredictor()
    for _ in range(5):
        p.observe("a")
    assert p.predict("a") is None
    assert p.predict("zzz") is None


def test_memory_is_bounded() -> None:
    p = MarkovPredictor(max_models=2)
    for m in ["a", "b", "c", "d", "e"]:
        p.observe(m)
    assert p.predict("a") is not None
    assert p.predict("b") is not None
    assert p.predict("c") is None


def _prefetcher(
    free_bytes: int, *, enabled: bool = True, state: ModelState = ModelState.UNLOADED
) -> tuple[Prefetcher, ModelRecord]:
    b = ModelRecord(ModelKey("b", "1"), ModelConfig(name="b", path="b"), Path("b/1"), state=state)

    def resolve(name: str) -> ModelRecord:
        if name != "b":
            raise ModelNotFoundError(f"model {name!r} is not in the repository")
        return b

    config = PrefetchConfig(enabled=enabled, min_probability=0.5, min_observations=2)
    return Prefetcher(config, resolve, lambda r: free_bytes, lambda r: 10), b


def _alternate(prefetcher: Prefetcher, rounds: int) -> None:
    for _ in range(rounds):
        prefetcher.after("a")
        prefetcher.after("b")


def test_the_prefetcher_names_the_likely_next_model_when_it_fits() -> None:
    prefetcher, b = _prefetcher(free_bytes=10)
    _alternate(prefetcher, 3)
    chosen = prefetcher.after("a")
    assert chosen is not None
    target, guess = chosen
    assert target is b
    assert guess.model == "b"
    assert guess.probability == 1.0


@pytest.mark.parametrize(
    ("free_bytes", "enabled", "state"),
    [
        (9, True, ModelState.UNLOADED),  # would need an eviction: never
        (10, False, ModelState.UNLOADED),  # prefetch disabled
        (10, True, ModelState.READY),  # already resident
    ],
)
def test_the_prefetcher_declines(free_bytes: int, enabled: bool, state: ModelState) -> None:
    prefetcher, _ = _prefetcher(free_bytes, enabled=enabled, state=state)
    _alternate(prefetcher, 3)
    assert prefetcher.after("a") is None


def test_an_unknown_successor_is_not_prefetched() -> None:
    prefetcher, _ = _prefetcher(free_bytes=10)
    for _ in range(3):
        prefetcher.after("a")
        prefetcher.after("gone")
    assert prefetcher.after("a") is None
