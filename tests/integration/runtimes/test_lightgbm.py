"""LightGBM text models (``Booster.save_model``): results equal LightGBM's own predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

lightgbm = pytest.importorskip("lightgbm", reason="needs the lightgbm extra (CI installs it)")

from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris  # noqa: E402

from tests.integration.runtimes.boosters import Built, check_inline, train_boosters  # noqa: E402
from tests.integration.runtimes.served import (  # noqa: E402
    infer,
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
def boosters(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Each case trained on scikit-learn's bundled data and saved with ``save_model``."""
    estimators = {"classifier": lightgbm.LGBMClassifier, "regressor": lightgbm.LGBMRegressor}

    def save(est: Any, path: Path) -> None:
        est.booster_.save_model(path)

    return train_boosters(tmp_path_factory.mktemp("lgbm"), CASES, estimators, save)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_lightgbm_predictions(boosters: Built, case: str) -> None:
    check_inline("lightgbm", boosters, case, CASES[case][1])


@pytest.mark.slow  # a server and a worker importing the library: several seconds
async def test_served_booster_answers_like_lightgbm(boosters: Built, tmp_path: Path) -> None:
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
