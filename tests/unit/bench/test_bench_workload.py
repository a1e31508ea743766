"""Model mixes, traces and the payload factory: pure functions, no server."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import orjson
import pytest

from modelyard.bench.errors import BenchConfigError, TargetError
from modelyard.bench.payload import (
    ModelMetadata,
    TensorSpec,
    payload_from_file,
    random_payload,
)
from modelyard.bench.workload import MixSpec, TraceMix, trace, uniform, zipf

MODELS = ("a", "b", "c", "d")
DRAWS = 20_000


def test_uniform_covers_every_model_evenly_and_repeats_with_its_seed() -> None:
    mix = uniform(MODELS, seed=3)
    counts = Counter(itertools.islice(mix.choices(), DRAWS))
    assert set(counts) == set(MODELS)
    assert all(abs(n - DRAWS / 4) < DRAWS * 0.03 for n in counts.values())
    first = list(itertools.islice(mix.choices(), 100))
    assert first == list(itertools.islice(uniform(MODELS, seed=3).choices(), 100))


def test_zipf_is_skewed_towards_the_first_models() -> None:
    mix = zipf(MODELS, s=1.1, seed=0)
    counts = Counter(itertools.islice(mix.choices(), DRAWS))
    ordered = [counts[m] for m in MODELS]
    assert ordered == sorted(ordered, reverse=True)
    # Rank 1 vs rank 2 should be near 2**1.1 ≈ 2.14.
    assert 1.9 < counts["a"] / counts["b"] < 2.4
    weights = mix.weights()
    assert sum(weights) == pytest.approx(1.0)
    assert counts["a"] / DRAWS == pytest.approx(weights[0], abs=0.02)


def test_zipf_is_deterministic_per_seed() -> None:
    def draw(seed: int) -> list[str]:
        return list(itertools.islice(zipf(MODELS, 1.1, seed).choices(), 500))

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_zipf_rejects_a_non_positive_exponent() -> None:
    with pytest.raises(BenchConfigError, match="exponent"):
        zipf(MODELS, s=0)


def test_a_mix_needs_models() -> None:
    with pytest.raises(BenchConfigError, match="at least one model"):
        uniform([])


MIX_SPECS = {
    "uniform": MixSpec(),
    "zipf": MixSpec(kind="zipf", zipf_s=1.1),
    "zipf:0.8": MixSpec(kind="zipf", zipf_s=0.8),
    "trace:t.csv": MixSpec(kind="trace", trace_path=Path("t.csv")),
}


@pytest.mark.parametrize(("text", "expected"), MIX_SPECS.items(), ids=list(MIX_SPECS))
def test_mix_spec_parses(text: str, expected: MixSpec) -> None:
    assert MixSpec.parse(text) == expected


@pytest.mark.parametrize("text", ["zipf:x", "zipf:-1", "trace", "pareto", "uniform:2"])
def test_mix_spec_rejects(text: str) -> None:
    with pytest.raises(BenchConfigError):
        MixSpec.parse(text)


def test_trace_reads_sorts_and_cycles(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp_s,model\n# a comment\n10.5,b\n10.0,a\n\n11.0,a\n")
    mix = trace(path)
    assert isinstance(mix, TraceMix)
    assert [(e.offset_s, e.model) for e in mix.entries] == [(0.0, "a"), (0.5, "b"), (1.0, "a")]
    assert mix.models == ("a", "b")
    assert list(itertools.islice(mix.choices(), 5)) == ["a", "b", "a", "a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1.0,a,extra\n", ":1: expected"),
        ("0,a\nsoon,b\n", ":2: bad timestamp"),
        ("", "no requests"),
    ],
    ids=["columns", "timestamp", "empty"],
)
def test_trace_reports_bad_rows(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(BenchConfigError, match=message):
        trace(path)


def test_mix_spec_build_uses_the_trace_models(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("0,x\n1,y\n")
    assert MixSpec.parse(f"trace:{path}").build(["ignored"]).models == ("x", "y")


def test_random_payload_fills_every_datatype_with_dynamic_dims_as_one() -> None:
    specs = (
        TensorSpec("f", "FP32", (-1, 3)),
        TensorSpec("h", "FP16", (2,)),
        TensorSpec("i", "INT64", (2, 2)),
        TensorSpec("u", "UINT8", (1,)),
        TensorSpec("b", "BOOL", (3,)),
        TensorSpec("s", "BYTES", (-1,)),
    )
    payload = random_payload(ModelMetadata("m", specs), seed=1)
    body = orjson.loads(payload.json_body)
    shapes = {item["name"]: item["shape"] for item in body["inputs"]}
    assert shapes == {"f": [1, 3], "h": [2], "i": [2, 2], "u": [1], "b": [3], "s": [1]}
    data = {item["name"]: item["data"] for item in body["inputs"]}
    assert all(isinstance(v, float) for v in data["f"] + data["h"])
    assert all(isinstance(v, int) and not isinstance(v, bool) for v in data["i"] + data["u"])
    assert all(isinstance(v, bool) for v in data["b"])
    assert all(isinstance(v, str) for v in data["s"])
    assert payload.json_body == random_payload(ModelMetadata("m", specs), seed=1).json_body


def test_random_payload_rejects_what_it_cannot_fill() -> None:
    with pytest.raises(TargetError, match="datatype 'COMPLEX'"):
        random_payload(ModelMetadata("m", (TensorSpec("x", "COMPLEX", (1,)),)))
    with pytest.raises(TargetError, match="no inputs"):
        random_payload(ModelMetadata("m", ()))
    with pytest.raises(TargetError, match="elements"):
        random_payload(ModelMetadata("m", (TensorSpec("x", "FP32", (100_000, 1_000)),)))


def test_metadata_from_json_reads_v2_metadata() -> None:
    body = {"name": "m", "inputs": [{"name": "x", "datatype": "fp32", "shape": [-1, 2]}]}
    assert ModelMetadata.from_json(body) == ModelMetadata("m", (TensorSpec("x", "FP32", (-1, 2)),))
    with pytest.raises(TargetError):
        ModelMetadata.from_json({"name": "m"})


def test_payload_file_is_sent_as_written_and_flattened_for_grpc(tmp_path: Path) -> None:
    path = tmp_path / "body.json"
    raw = b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1,2],[3,4]]}]}'
    path.write_bytes(raw)
    payload = payload_from_file("m", path)
    assert payload.json_body == raw
    assert payload.inputs[0].data == [1, 2, 3, 4]
    path.write_bytes(b'{"inputs": []}')
    with pytest.raises(BenchConfigError, match="non-empty"):
        payload_from_file("m", path)
    with pytest.raises(BenchConfigError, match="cannot read"):
        payload_from_file("m", tmp_path / "missing.json")
