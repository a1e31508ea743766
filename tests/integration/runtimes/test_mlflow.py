"""MLflow model folders saved with MLflow's own ``save_model``: native flavours on
modelyard's runtimes, pyfunc with its signature as metadata; results equal
``mlflow.pyfunc``'s predictions."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("xgboost", reason="needs the xgboost extra (CI installs it)")
pytest.importorskip("lightgbm", reason="needs the lightgbm extra (CI installs it)")
with warnings.catch_warnings():
    # MLflow warns about its own type hints while importing (its UserWarning, not ours).
    warnings.simplefilter("ignore")
    pytest.importorskip("mlflow", reason="needs the mlflow extra (CI installs it)")
    import mlflow
    import mlflow.lightgbm
    import mlflow.onnx
    import mlflow.pyfunc
    import mlflow.sklearn
    import mlflow.xgboost
    from mlflow.models import infer_signature

import lightgbm
import pandas as pd
import xgboost
from sklearn.datasets import load_iris
from sklearn.linear_model import LogisticRegression

from modelyard.examples.sklearn_models import export_sklearn_onnx
from modelyard.repository.runtime_guess import guess_runtime
from modelyard.runtimes.mlflow import MLflowRuntime
from modelyard.runtimes.mlflow_model import read_mlmodel
from tests.integration.runtimes.served import (
    infer,
    load_inline,
    serving,
    tensors_of,
    triton_metadata,
)

# Importing MLflow and starting a worker that imports it take seconds: CI runs these.
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width"]
PIN = [f"mlflow=={mlflow.__version__}"]
"""Explicit requirements: MLflow's inference of them imports every module in sight."""


@pytest.fixture(scope="module")
def iris() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled iris data."""
    x, y = load_iris(return_X_y=True)
    return x, y


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, iris: tuple[np.ndarray, np.ndarray]) -> Path:
    """One MLflow model folder per flavour, each as version 1 of a model."""
    root = tmp_path_factory.mktemp("mlflow")
    x, y = iris
    frame = pd.DataFrame(x, columns=COLUMNS)
    logreg = LogisticRegression(max_iter=300).fit(x, y)
    mlflow.sklearn.save_model(
        logreg,
        root / "sk-columns" / "1",
        signature=infer_signature(frame, logreg.predict(x)),
        pip_requirements=PIN,
    )
    mlflow.sklearn.save_model(
        logreg, root / "sk-no-output" / "1", signature=infer_signature(frame), pip_requirements=PIN
    )
    booster = xgboost.XGBClassifier(n_estimators=6, max_depth=3, n_jobs=1).fit(x, y)
    mlflow.xgboost.save_model(
        booster,
        root / "xgb" / "1",
        signature=infer_signature(x.astype(np.float32), booster.predict_proba(x)),
        pip_requirements=PIN,
    )
    lgb = lightgbm.train(
        {"objective": "multiclass", "num_class": 3, "num_leaves": 7, "verbose": -1},
        lightgbm.Dataset(x, y),
        num_boost_round=6,
    )
    mlflow.lightgbm.save_model(lgb, root / "lgb" / "1", pip_requirements=PIN)
    onnx_file = export_sklearn_onnx(logreg, 4, root / "onnx-src" / "model.onnx")
    import onnx

    mlflow.onnx.save_model(onnx.load(str(onnx_file)), root / "onnx" / "1", pip_requirements=PIN)
    return root


def _pyfunc_predict(folder: Path, data: Any) -> np.ndarray:
    return np.asarray(mlflow.pyfunc.load_model(str(folder)).predict(data))


ROUTES = {"xgb": "xgboost", "lgb": "lightgbm", "onnx": "onnx", "sk-columns": "sklearn"}
"""Model → the modelyard runtime its native flavour is routed to."""


@pytest.mark.parametrize("model", list(ROUTES))
def test_native_flavour_runs_on_modelyard_runtime(
    repo: Path, iris: tuple[np.ndarray, np.ndarray], model: str
) -> None:
    x = iris[0][::10]
    runtime = MLflowRuntime()
    # sklearn's flavour is skops on recent MLflow, cloudpickle on older ones (trusted).
    runtime.load(load_spec(repo / model / "1", trusted=model == "sk-columns"))
    assert runtime.route == ROUTES[model]
    dtype = np.float32 if model in ("xgb", "onnx") else np.float64
    out = runtime.infer({runtime.inputs[0].name: x.astype(dtype)})
    if model == "xgb":
        reference = _pyfunc_predict(repo / model / "1", x.astype(np.float32))
        np.testing.assert_array_equal(out["predict"], reference)
    elif model == "lgb":
        reference = _pyfunc_predict(repo / model / "1", x)
        np.testing.assert_allclose(out["predict_proba"], reference, rtol=1e-9)
    elif model == "onnx":
        loaded = mlflow.pyfunc.load_model(str(repo / model / "1"))
        reference = loaded.predict({"input": x.astype(np.float32)})
        np.testing.assert_array_equal(out["label"], np.asarray(reference["label"]))
    else:
        reference = _pyfunc_predict(repo / model / "1", pd.DataFrame(x, columns=COLUMNS))
        np.testing.assert_array_equal(out["predict"], reference)
    assert guess_runtime(repo / model) == "mlflow"


def load_spec(folder: Path, **fields: Any) -> Any:
    """A RuntimeSpec for an MLflow folder."""
    from modelyard.runtimes import RuntimeSpec

    return RuntimeSpec(kind="mlflow", version_dir=str(folder), **fields)


def test_pyfunc_signature_becomes_metadata_and_answers_like_mlflow(
    repo: Path, iris: tuple[np.ndarray, np.ndarray]
) -> None:
    x = iris[0][::7]
    runtime = load_inline(
        "mlflow", repo / "sk-columns" / "1", trusted=True, options={"flavor": "pyfunc"}
    )
    assert [(t.name, t.datatype, t.shape) for t in runtime.inputs] == [
        (c, "FP64", (-1,)) for c in COLUMNS
    ]
    assert [(t.name, t.datatype, t.shape) for t in runtime.outputs] == [("predict", "INT64", (-1,))]
    out = runtime.infer({c: x[:, i] for i, c in enumerate(COLUMNS)})
    reference = _pyfunc_predict(repo / "sk-columns" / "1", pd.DataFrame(x, columns=COLUMNS))
    np.testing.assert_array_equal(out["predict"], reference)


def test_pyfunc_without_output_signature_is_described_from_one_call(
    repo: Path, iris: tuple[np.ndarray, np.ndarray]
) -> None:
    folder = repo / "sk-no-output" / "1"
    runtime = load_inline("mlflow", folder, trusted=True, options={"flavor": "pyfunc"})
    assert [(t.name, t.datatype, t.shape) for t in runtime.outputs] == [("predict", "INT64", (-1,))]
    x = iris[0][:6]
    out = runtime.infer({c: x[:, i] for i, c in enumerate(COLUMNS)})
    reference = _pyfunc_predict(folder, pd.DataFrame(x, columns=COLUMNS))
    np.testing.assert_array_equal(out["predict"], reference)


def test_pyfunc_needs_trust_because_it_runs_the_models_code(repo: Path) -> None:
    runtime = MLflowRuntime()
    with pytest.raises(ValueError, match="trusted: true"):
        runtime.load(load_spec(repo / "sk-columns" / "1", options={"flavor": "pyfunc"}))


def test_missing_mlflow_names_the_pinned_version(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fault: a server without the mlflow extra (None in sys.modules fails the import).
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.setitem(sys.modules, name, None)
    runtime = MLflowRuntime()
    spec = load_spec(repo / "sk-columns" / "1", trusted=True, options={"flavor": "pyfunc"})
    with pytest.raises(ModuleNotFoundError) as info:
        runtime.load(spec)
    message = str(info.value)
    assert f"pins mlflow=={mlflow.__version__}" in message
    assert "modelyard[mlflow]" in message
    assert read_mlmodel(repo / "sk-columns" / "1").pinned == PIN[0]


async def test_served_mlflow_models_answer_like_mlflow(
    repo: Path, iris: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    x = iris[0][::5]
    models: list[dict[str, Any]] = [
        # Preloaded: a worker importing MLflow can take longer than one HTTP timeout here.
        {
            "name": "sk-columns",
            "path": "sk-columns",
            "runtime": "mlflow",
            "trusted": True,
            "options": {"flavor": "pyfunc"},
            "preload": True,
        },
        {"name": "xgb", "path": "xgb", "runtime": "mlflow"},
    ]
    async with serving(repo, models, tmp_path) as (app, client):
        columns = await infer(client, "sk-columns", {c: x[:, i] for i, c in enumerate(COLUMNS)})
        boosted = await infer(client, "xgb", {"input": x.astype(np.float32)})
        meta = await triton_metadata(app, "sk-columns")
    frame = pd.DataFrame(x, columns=COLUMNS)
    np.testing.assert_array_equal(
        columns["predict"], _pyfunc_predict(repo / "sk-columns" / "1", frame)
    )
    np.testing.assert_array_equal(
        boosted["predict"], _pyfunc_predict(repo / "xgb" / "1", x.astype(np.float32))
    )
    assert tensors_of(meta, "inputs") == [(c, "FP64", [-1]) for c in COLUMNS]
    assert tensors_of(meta, "outputs") == [("predict", "INT64", [-1])]
