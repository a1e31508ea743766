"""LightGBM text models (``Booster.save_model``): results equal LightGBM's own predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

lightgbm = pytest.importorskip("lightgbm", reason="needs the lightgbm extra (CI installs it)")

from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris  # noqa: E402

from modelyard.repository.layout import guess_runtime  # noqa: E402
from tests.integration.runtimes.served import (  # noqa: E402
    infer,
    load_inline,
    serving,
    tensors_of,
    triton_metadata,
)

CASES = {
    "multiclass": (load_iris, "classifier", "model.txt"),
    "binary": (load_breast_cancer, "classifier", "model.txt"),
    "regressor": (load_diabetes, "regressor", "model.txt"),
}
"""Model name → (bundled data set, estimator kind, file name)."""


@pytest.fixture(scope="module")
def boosters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, np.ndarray, Path]]:
    """Each case trained on scikit-learn's bundled data and saved with ``save_model``."""
    root = tmp_path_factory.mktemp("lgbm")
    built: dict[str, tuple[Any, np.ndarray, Path]] = {}
    for name, (loader, kind, file_name) in CASES.items():
        x, y = loader(return_X_y=True)
        cls = lightgbm.LGBMClassifier if kind == "classifier" else lightgbm.LGBMRegressor
        est = cls(n_estimators=8, max_depth=3, n_jobs=1).fit(x, y)
        folder = root / name / "1"
        folder.mkdir(parents=True)
        est.booster_.save_model(folder / file_name)
        built[name] = (est, x[:16].astype(np.float32), root / name)
    return built


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_lightgbm_predictions(
    boosters: dict[str, tuple[Any, np.ndarray, Path]], case: str
) -> None:
    est, x, model_dir = boosters[case]
    runtime = load_inline("lightgbm", model_dir / "1")
    out = runtime.infer({"input": x})
    assert [t.name for t in runtime.inputs] == ["input"]
    assert runtime.inputs[0].shape == (-1, x.shape[1])
    np.testing.assert_array_equal(out["predict"], est.predict(x))
    if CASES[case][1] == "classifier":
        np.testing.assert_allclose(out["predict_proba"], est.predict_proba(x), rtol=1e-6)
        assert runtime.outputs[1].shape == (-1, est.predict_proba(x).shape[1])
    else:
        assert [t.name for t in runtime.outputs] == ["predict"]
    assert guess_runtime(model_dir) == "lightgbm"


@pytest.mark.slow  # a server and a worker importing the library: several seconds
async def test_served_booster_answers_like_lightgbm(
    boosters: dict[str, tuple[Any, np.ndarray, Path]], tmp_path: Path
) -> None:
    est, x, model_dir = boosters["multiclass"]
    # No 'runtime:' in the config entry: the repository recognises the booster file.
    models = [{"name": "iris-lgbm", "path": model_dir.name, "runtime": "lightgbm"}]
    async with serving(model_dir.parent, models, tmp_path) as (app, client):
        out = await infer(client, "iris-lgbm", {"input": x})
        meta = await triton_metadata(app, "iris-lgbm")
    np.testing.assert_array_equal(out["predict"], est.predict(x))
    np.testing.assert_allclose(out["predict_proba"], est.predict_proba(x), rtol=1e-6)
    assert tensors_of(meta, "inputs") == [("input", "FP32", [-1, 4])]
    assert tensors_of(meta, "outputs") == [
        ("predict", "INT64", [-1]),
        ("predict_proba", "FP64", [-1, 3]),
    ]
