"""XGBoost boosters saved with ``save_model``: results equal XGBoost's own predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

xgboost = pytest.importorskip("xgboost", reason="needs the xgboost extra (CI installs it)")

from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris  # noqa: E402

from tests.integration.runtimes.boosters import Built, check_inline, train_boosters  # noqa: E402
from tests.integration.runtimes.served import (  # noqa: E402
    infer,
    serving,
    tensor,
    tensors_of,
    triton_metadata,
)

CASES = {
    "multiclass-json": (load_iris, "classifier", "model.json"),
    "binary-ubj": (load_breast_cancer, "classifier", "model.ubj"),
    "regressor-json": (load_diabetes, "regressor", "model.json"),
}
"""Model name → (bundled data set, estimator kind, file name)."""


@pytest.fixture(scope="module")
def boosters(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Each case trained on scikit-learn's bundled data and saved with ``save_model``."""
    estimators = {"classifier": xgboost.XGBClassifier, "regressor": xgboost.XGBRegressor}

    def save(est: Any, path: Path) -> None:
        est.save_model(path)

    return train_boosters(tmp_path_factory.mktemp("xgb"), CASES, estimators, save)


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_equal_xgboost_predictions(boosters: Built, case: str) -> None:
    check_inline("xgboost", boosters, case, CASES[case][1])


@pytest.mark.slow  # a server and a worker importing the library: several seconds
async def test_served_booster_answers_like_xgboost(boosters: Built, tmp_path: Path) -> None:
    est, x, model_dir = boosters["multiclass-json"]
    models = [{"name": "iris-xgb", "path": model_dir.name, "runtime": "xgboost"}]
    async with serving(model_dir.parent, models, tmp_path) as (app, client):
        out = await infer(client, "iris-xgb", {"input": x})
        meta = await triton_metadata(app, "iris-xgb")
        # A wrong feature count is the client's error, named, and the model keeps serving.
        wrong = {"inputs": [tensor("input", x[:, :3])]}
        bad = await client.post("/v2/models/iris-xgb/infer", json=wrong)
        again = await infer(client, "iris-xgb", {"input": x[:2]})
        # A folder the YAML does not declare: its runtime is recognised from the .ubj file.
        loaded = await client.post("/v2/repository/models/binary-ubj/load")
        binary_est, binary_x, _ = boosters["binary-ubj"]
        binary = await infer(client, "binary-ubj", {"input": binary_x})
    assert loaded.status_code == 200, loaded.text
    np.testing.assert_allclose(
        binary["predict_proba"], binary_est.predict_proba(binary_x), rtol=1e-6
    )
    assert bad.status_code == 400, bad.text
    assert "input" in bad.json()["error"]
    np.testing.assert_array_equal(again["predict"], est.predict(x[:2]))
    np.testing.assert_array_equal(out["predict"], est.predict(x))
    np.testing.assert_allclose(out["predict_proba"], est.predict_proba(x), rtol=1e-6)
    assert tensors_of(meta, "inputs") == [("input", "FP32", [-1, 4])]
    assert tensors_of(meta, "outputs") == [
        ("predict", "INT64", [-1]),
        ("predict_proba", "FP32", [-1, 3]),
    ]
