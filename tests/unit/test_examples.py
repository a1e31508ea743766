"""The example models are real: they run in onnxruntime and agree with their sources."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import skops.io
import yaml

from modelyard.config.settings import load_settings
from modelyard.examples import (
    DIGITS_CLASSIFIERS,
    build_add_onnx,
    build_digits_workload,
    build_example_repository,
    build_identity_onnx,
    build_mlp_onnx,
    build_pressure_workload,
    digits_sample,
    minilm_available,
    train_digits_classifier,
    train_iris_classifier,
)
from modelyard.examples.mlp import MIB
from modelyard.examples.repository import llm_available, pressure_sizes_mb
from modelyard.examples.sklearn_models import digits_data, iris_data

SMALL_MLP_MB = 2.0
ALLOWED_MODEL_KEYS = {
    "name",
    "path",
    "runtime",
    "memory_mb",
    "preload",
    "max_batch_size",
    "max_queue_delay_s",
    "priority",
    "timeout_s",
    "isolation",
    "share_weights",
    "generation",
}
LLM_SIZES = ("tiny",) if llm_available() else ()
EXAMPLE_MODELS = [
    *(f"digits-{kind}" for kind in DIGITS_CLASSIFIERS),
    "iris-logreg",
    "iris-skops",
    f"mlp-{SMALL_MLP_MB:g}mb",
    "identity",
    *(f"llama-{size}" for size in LLM_SIZES),
]


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _config(path: Path) -> dict[str, object]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _models(config: dict[str, object]) -> dict[str, dict[str, object]]:
    models = config["models"]
    assert isinstance(models, list)
    return {m["name"]: m for m in models}


@pytest.fixture(scope="module")
def example_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example repository without MiniLM, built once for this module."""
    root = tmp_path_factory.mktemp("example-repo")
    return build_example_repository(
        root, include_minilm=False, big_mlp_mb=SMALL_MLP_MB, llm_sizes=LLM_SIZES
    )


@pytest.mark.parametrize("kind", DIGITS_CLASSIFIERS, ids=DIGITS_CLASSIFIERS)
def test_digits_onnx_matches_sklearn(example_config: Path, kind: str) -> None:
    features, _ = digits_data()
    # Trained again here: equal answers also show that training is deterministic.
    estimator = train_digits_classifier(kind)
    session = _session(example_config.parent / f"digits-{kind}" / "1" / "model.onnx")

    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input", "tensor(float)", [None, 64])
    ]
    assert [(o.name, o.type) for o in session.get_outputs()] == [
        ("label", "tensor(int64)"),
        ("probabilities", "tensor(float)"),
    ]
    labels, probabilities = session.run(None, {"input": features})
    np.testing.assert_array_equal(labels, estimator.predict(features))
    np.testing.assert_allclose(probabilities, estimator.predict_proba(features), atol=1e-4)


def test_iris_onnx_and_skops_match_sklearn(example_config: Path) -> None:
    features, _ = iris_data()
    estimator = train_iris_classifier()
    root = example_config.parent

    labels, probabilities = _session(root / "iris-logreg" / "1" / "model.onnx").run(
        None, {"input": features}
    )
    np.testing.assert_array_equal(labels, estimator.predict(features))
    assert probabilities.shape == (150, 3)

    skops_file = root / "iris-skops" / "1" / "model.skops"
    assert skops.io.get_untrusted_types(file=skops_file) == []
    loaded = skops.io.load(skops_file, trusted=[])
    np.testing.assert_array_equal(loaded.predict(features), estimator.predict(features))


def test_example_config_lists_every_model(example_config: Path) -> None:
    config = _config(example_config)
    models = _models(config)

    assert list(models) == EXAMPLE_MODELS
    assert config["devices"] == [{"name": "cpu", "memory_budget_mb": 2048}]
    for name, model in models.items():
        assert set(model) <= ALLOWED_MODEL_KEYS, name
        version_dir = example_config.parent / str(model["path"]) / "1"
        assert any(version_dir.iterdir()), name
    assert models["iris-skops"]["runtime"] == "sklearn"
    assert models["identity"]["isolation"] == "inline"
    lazy = {name for name, model in models.items() if not model["preload"]}
    assert lazy == {"iris-skops", f"mlp-{SMALL_MLP_MB:g}mb", *(f"llama-{s}" for s in LLM_SIZES)}
    for size in LLM_SIZES:
        assert models[f"llama-{size}"]["runtime"] == "llama_cpp"
        assert "memory_mb" not in models[f"llama-{size}"]  # estimated from the GGUF header


def test_example_config_is_valid_server_settings(example_config: Path) -> None:
    settings = load_settings(example_config)

    assert [m.name for m in settings.models] == EXAMPLE_MODELS
    for model in settings.models:
        assert settings.model_path(model).is_dir()


def test_example_repository_build_is_idempotent(example_config: Path) -> None:
    model_file = example_config.parent / "digits-svc" / "1" / "model.onnx"
    before = model_file.stat().st_mtime_ns

    again = build_example_repository(
        example_config.parent, include_minilm=False, big_mlp_mb=SMALL_MLP_MB, llm_sizes=LLM_SIZES
    )

    assert again == example_config
    assert model_file.stat().st_mtime_ns == before


def test_digits_workload_preloads_the_five_classifiers(
    example_config: Path, tmp_path: Path
) -> None:
    # Reuse the models built already; the builder skips files that exist.
    for kind in DIGITS_CLASSIFIERS:
        name = f"digits-{kind}"
        shutil.copytree(example_config.parent / name, tmp_path / name)

    models = _models(_config(build_digits_workload(tmp_path)))

    assert list(models) == [f"digits-{kind}" for kind in DIGITS_CLASSIFIERS]
    assert all(model["preload"] for model in models.values())


def test_pressure_workload_budget_is_a_fraction_of_the_total(tmp_path: Path) -> None:
    config = _config(build_pressure_workload(tmp_path, n=3, min_mb=0.5, max_mb=1.5))
    models = _models(config)

    assert len(models) == 3
    assert not any(model["preload"] for model in models.values())
    footprints = [float(str(model["memory_mb"])) for model in models.values()]
    devices = config["devices"]
    assert isinstance(devices, list)
    budget = devices[0]["memory_budget_mb"]
    assert max(footprints) < budget < sum(footprints)
    for model in models.values():
        assert (tmp_path / str(model["path"]) / "1" / "model.onnx.data").is_file()


def test_pressure_sizes_spread_from_min_to_max() -> None:
    assert pressure_sizes_mb(5, 50, 200) == [50.0, 87.5, 125.0, 162.5, 200.0]


@pytest.mark.parametrize("target_mb", [0.25, SMALL_MLP_MB], ids=["quarter-mb", "small"])
def test_mlp_weights_are_within_ten_percent_of_target(tmp_path: Path, target_mb: float) -> None:
    path = build_mlp_onnx(tmp_path / "model.onnx", target_mb)

    model = onnx.load(str(path))
    weight_bytes = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    assert weight_bytes == pytest.approx(target_mb * MIB, rel=0.1)
    output = _session(path).run(None, {"input": digits_sample(3)})[0]
    assert output.shape == (3, 10)
    assert output.dtype == np.float32


def test_mlp_external_data_is_written_beside_the_model(tmp_path: Path) -> None:
    inline = build_mlp_onnx(tmp_path / "inline" / "model.onnx", SMALL_MLP_MB, n_in=8, n_out=3)
    external = build_mlp_onnx(
        tmp_path / "external" / "model.onnx", SMALL_MLP_MB, n_in=8, n_out=3, external_data=True
    )

    data_file = external.with_name("model.onnx.data")
    assert data_file.is_file()
    assert data_file.stat().st_size == pytest.approx(SMALL_MLP_MB * MIB, rel=0.1)
    assert external.stat().st_size < 64 * 1024
    sample = np.ones((2, 8), dtype=np.float32)
    np.testing.assert_array_equal(
        _session(inline).run(None, {"input": sample})[0],
        _session(external).run(None, {"input": sample})[0],
    )


def test_identity_and_add_models(tmp_path: Path) -> None:
    sample = np.arange(8, dtype=np.float32).reshape(2, 4)

    identity = _session(build_identity_onnx(tmp_path / "identity.onnx"))
    added = _session(build_add_onnx(tmp_path / "add.onnx", 2.5))

    assert identity.get_inputs()[0].shape == ["batch", 4]
    np.testing.assert_array_equal(identity.run(None, {"input": sample})[0], sample)
    np.testing.assert_array_equal(added.run(None, {"input": sample})[0], sample + 2.5)


def test_digits_sample_wraps_around() -> None:
    sample = digits_sample(1800)

    assert sample.shape == (1800, 64)
    assert sample.dtype == np.float32
    np.testing.assert_array_equal(sample[1797:], sample[:3])


def test_unknown_digits_classifier_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown digits classifier"):
        train_digits_classifier("perceptron")


@pytest.mark.skipif(not minilm_available(), reason="needs the torch extra")
def test_minilm_export_matches_sentence_transformers(tmp_path: Path) -> None:
    from modelyard.examples.minilm import export_minilm_onnx, reference_embeddings, tokenize

    texts = ["a model server", "loads and evicts many models under one memory budget", "x"]
    session = _session(export_minilm_onnx(tmp_path / "model.onnx"))

    assert [(i.name, i.type, i.shape) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)", ["batch", "seq"]),
        ("attention_mask", "tensor(int64)", ["batch", "seq"]),
    ]
    tokens = tokenize(texts)
    embedding = session.run(["embedding"], tokens)[0]
    assert embedding.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(embedding, reference_embeddings(texts), atol=1e-4)
