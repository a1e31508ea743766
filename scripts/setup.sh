#!/usr/bin/env bash
# Create .venv and install modelyard with its test tools, the runtime extras the tests
# exercise (xgboost, lightgbm, mlflow; huggingface beside torch), and the torch extra.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="test,xgboost,lightgbm,mlflow"
if [ "${MODELYARD_NO_TORCH:-0}" != "1" ]; then extras="${extras},torch,huggingface"; fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
