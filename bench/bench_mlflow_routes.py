"""MLflow models: modelyard's native runtime for a flavour vs ``mlflow.pyfunc``, per call.

Run from the repository root (needs the mlflow, xgboost and lightgbm extras)::

    .venv/bin/python bench/bench_mlflow_routes.py            # batch 1 and 256
    .venv/bin/python bench/bench_mlflow_routes.py --quick    # fewer rounds

Saves one model per native flavour with MLflow's own ``save_model`` (scikit-learn
logistic regression, XGBoost and LightGBM boosters, the logistic regression as ONNX, all
on the bundled iris data), then, in this process, times:

- **load**: :class:`~modelyard.runtimes.mlflow.MLflowRuntime` (the native route) vs
  ``mlflow.pyfunc.load_model``, best of ``--repeats``;
- **infer**: the runtime's ``infer`` vs ``pyfunc.predict`` on the same batch, thread CPU
  time per call, best of ``--repeats`` rounds, the two interleaved in each round;
- **import**: ``import mlflow.pyfunc`` in a fresh interpreter (what a pyfunc worker pays
  and a native one does not).

The ratio column is pyfunc ÷ native: above 1, the native route is faster.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.examples.sklearn_models import export_sklearn_onnx
from modelyard.runtimes import RuntimeSpec
from modelyard.runtimes.mlflow import MLflowRuntime

BATCHES = (1, 256)


def _save_models(root: Path) -> dict[str, Path]:
    import lightgbm
    import onnx
    import xgboost
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import mlflow
        import mlflow.lightgbm
        import mlflow.onnx
        import mlflow.sklearn
        import mlflow.xgboost
    pin = [f"mlflow=={mlflow.__version__}"]
    x, y = load_iris(return_X_y=True)
    logreg = LogisticRegression(max_iter=300).fit(x, y)
    mlflow.sklearn.save_model(logreg, root / "sklearn", pip_requirements=pin)
    xgb = xgboost.XGBClassifier(n_estimators=20, max_depth=3, n_jobs=1).fit(x, y)
    mlflow.xgboost.save_model(xgb, root / "xgboost", pip_requirements=pin)
    params = {"objective": "multiclass", "num_class": 3, "num_leaves": 7, "verbose": -1}
    lgb = lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=20)
    mlflow.lightgbm.save_model(lgb, root / "lightgbm", pip_requirements=pin)
    onnx_file = export_sklearn_onnx(logreg, 4, root / "onnx-src" / "model.onnx")
    mlflow.onnx.save_model(onnx.load(str(onnx_file)), root / "onnx", pip_requirements=pin)
    return {f: root / f for f in ("sklearn", "xgboost", "lightgbm", "onnx")}


def _cpu_us(fn: Callable[[], object], number: int) -> float:
    t0 = time.thread_time()
    for _ in range(number):
        fn()
    return (time.thread_time() - t0) / number * 1e6


def _best_s(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _import_s() -> float:
    code = "import time,warnings;warnings.simplefilter('ignore');t=time.perf_counter();"
    code += "import mlflow.pyfunc;print(time.perf_counter()-t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _native(folder: Path) -> MLflowRuntime:
    runtime = MLflowRuntime()
    runtime.load(RuntimeSpec(kind="mlflow", version_dir=str(folder), trusted=True))
    return runtime


def main() -> None:
    """Build the models, time both routes, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results/mlflow_routes.json")
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    number = 20 if args.quick else 200
    import mlflow.pyfunc

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = _save_models(Path(tmp))
        rng = np.random.default_rng(0)
        for flavor, folder in folders.items():
            native = _native(folder)
            pyfunc = mlflow.pyfunc.load_model(str(folder))
            row: dict[str, Any] = {
                "flavor": flavor,
                "route": native.route,
                "load_native_ms": 1e3 * _best_s(lambda f=folder: _native(f), repeats),
                "load_pyfunc_ms": 1e3
                * _best_s(lambda f=folder: mlflow.pyfunc.load_model(str(f)), repeats),
            }
            name = native.inputs[0].name
            dtype = np.float32 if native.inputs[0].datatype == "FP32" else np.float64
            for batch in BATCHES:
                x = (rng.random((batch, 4)) * 5).astype(dtype)
                best_native = best_pyfunc = float("inf")
                for _ in range(repeats):
                    best_native = min(
                        best_native,
                        _cpu_us(lambda x=x, r=native, n=name: r.infer({n: x}), number),  # type: ignore[misc]
                    )
                    best_pyfunc = min(
                        best_pyfunc,
                        _cpu_us(lambda x=x, p=pyfunc: p.predict(x), number),  # type: ignore[misc]
                    )
                row[f"infer_b{batch}_native_us"] = best_native
                row[f"infer_b{batch}_pyfunc_us"] = best_pyfunc
            rows.append(row)
    result = {"import_pyfunc_s": _import_s(), "rows": rows, "repeats": repeats}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"import mlflow.pyfunc in a fresh interpreter: {result['import_pyfunc_s']:.2f} s")
    print("| flavour | native runtime | load native ms | load pyfunc ms |", end="")
    print(
        " b1 native µs | b1 pyfunc µs | b1 ratio | b256 native µs | b256 pyfunc µs | b256 ratio |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b1 = r["infer_b1_pyfunc_us"] / r["infer_b1_native_us"]
        b256 = r["infer_b256_pyfunc_us"] / r["infer_b256_native_us"]
        print(
            f"| {r['flavor']} | {r['route']} | {r['load_native_ms']:.1f} | "
            f"{r['load_pyfunc_ms']:.1f} | {r['infer_b1_native_us']:.0f} | "
            f"{r['infer_b1_pyfunc_us']:.0f} | {b1:.2f}x | {r['infer_b256_native_us']:.0f} | "
            f"{r['infer_b256_pyfunc_us']:.0f} | {b256:.2f}x |"
        )


if __name__ == "__main__":
    main()
