#!/usr/bin/env bash
# Create bench/peers/.venvs/mlserver with Seldon MLServer and its scikit-learn runtime.
# Usage: bench/peers/setup_mlserver.sh            (idempotent; re-run to repair)
#        PYTHON=python3.11 bench/peers/setup_mlserver.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venvs/mlserver"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# NOTE: MLServer 1.7.1 imports uvloop APIs that uvloop 0.22 removed; pin 0.21.0.
# scikit-learn and joblib come in through mlserver-sklearn; the models are pickled with
# joblib by the modelyard venv, so both venvs should hold the same scikit-learn minor version
# (run_peers.py / serve_mlserver.py check and warn otherwise).
"$venv/bin/python" -m pip install --quiet \
    "mlserver==1.7.1" "mlserver-sklearn==1.7.1" "uvloop==0.21.0" ${SKLEARN_SPEC:+"$SKLEARN_SPEC"}
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("mlserver", "mlserver-sklearn", "uvloop", "scikit-learn", "joblib", "numpy"):
    print(f"{name}=={md.version(name)}")
PY
echo "mlserver venv ready: $venv"
