"""The Markov predictor behind predictive preloading."""

from __future__ import annotations

import pytest

from modelyard.manager.prefetch import MarkovPredictor


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
