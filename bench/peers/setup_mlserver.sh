#!/usr/bin/env bash
# Create bench/peers/.venvs/mlserver with Seldon MLServer and its scikit-learn runtime.
# Usage: bench/peers/setup_mlserver.sh            (idempotent; re-run to repair)
#        PYTHON=python3.11 bench/peers/setup_mlserver.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venvs/mlserver"
python="${PYTHON:-python3}"

# The models are pickled with joblib by the modelyard venv, so unpickle them with the same
# scikit-learn version; SKLEARN_SPEC overrides (e.g. SKLEARN_SPEC="scikit-learn==1.6.1").
default_sklearn_spec() {
    local modelyard_python="$here/../../.venv/bin/python" version
    if [[ -x "$modelyard_python" ]] \
        && version="$("$modelyard_python" -c 'import sklearn; print(sklearn.__version__)' 2>/dev/null)"; then
        echo "scikit-learn==$version"
    else
        echo "scikit-learn"
    fi
}

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# NOTE: MLServer 1.7.1 starts its loops with uvloop.install(); it is known to work with
# uvloop 0.21.0, so that is pinned (newer uvloop releases change that API).
"$venv/bin/python" -m pip install --quiet \
    "mlserver==1.7.1" "mlserver-sklearn==1.7.1" "uvloop==0.21.0" "${SKLEARN_SPEC:-$(default_sklearn_spec)}"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("mlserver", "mlserver-sklearn", "uvloop", "scikit-learn", "joblib", "numpy"):
    print(f"{name}=={md.version(name)}")
PY
echo "mlserver venv ready: $venv"
