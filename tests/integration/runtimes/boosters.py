"""Gradient-boosted trees trained at test time, for the XGBoost and LightGBM tests: both
libraries' scikit-learn estimators, saved as files, must serve what the library predicts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.repository.runtime_guess import guess_runtime
from tests.integration.runtimes.served import load_inline

Case = tuple[Callable[..., Any], str, str]
"""(bundled scikit-learn data set, estimator kind, file name)."""
Built = dict[str, tuple[Any, np.ndarray, Path]]
"""Model name → (fitted estimator, 16 rows of its data, model folder)."""


def train_boosters(
    root: Path,
    cases: Mapping[str, Case],
    estimators: Mapping[str, Any],
    save: Callable[[Any, Path], None],
) -> Built:
    """Each case trained on its data (``estimators``: kind → class) and saved by ``save``."""
    built: Built = {}
    for name, (loader, kind, file_name) in cases.items():
        x, y = loader(return_X_y=True)
        est = estimators[kind](n_estimators=8, max_depth=3, n_jobs=1).fit(x, y)
        folder = root / name / "1"
        folder.mkdir(parents=True)
        save(est, folder / file_name)
        built[name] = (est, x[:16].astype(np.float32), root / name)
    return built


def check_inline(runtime_kind: str, built: Built, case: str, kind: str) -> None:
    """The runtime loaded in this process answers exactly as the estimator predicts, with
    the tensors it should declare, and the repository recognises its file."""
    est, x, model_dir = built[case]
    runtime = load_inline(runtime_kind, model_dir / "1")
    out = runtime.infer({"input": x})
    assert [t.name for t in runtime.inputs] == ["input"]
    assert runtime.inputs[0].shape == (-1, x.shape[1])
    np.testing.assert_array_equal(out["predict"], est.predict(x))
    if kind == "classifier":
        np.testing.assert_allclose(out["predict_proba"], est.predict_proba(x), rtol=1e-6)
        assert runtime.outputs[1].shape == (-1, est.predict_proba(x).shape[1])
    else:
        assert [t.name for t in runtime.outputs] == ["predict"]
    assert guess_runtime(model_dir) == runtime_kind
