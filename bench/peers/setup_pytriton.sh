#!/usr/bin/env bash
# Create bench/peers/.venvs/pytriton with NVIDIA PyTriton (its wheel bundles a tritonserver
# binary and Python-backend stubs) and ONNX Runtime for the models, then check that the
# bundled binaries find every shared library they link against.
# Usage: bench/peers/setup_pytriton.sh            (idempotent; re-run to repair)
#        PYTHON=python3.11 bench/peers/setup_pytriton.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venvs/pytriton"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The wheel is manylinux_2_35 (glibc >= 2.35), x86_64 or aarch64, Python 3.8 to 3.13.
"$venv/bin/python" -m pip install --quiet "nvidia-pytriton==0.7.0" onnxruntime
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("nvidia-pytriton", "tritonclient", "onnxruntime", "numpy"):
    print(f"{name}=={md.version(name)}")
PY

# tritonserver and the stub of this Python version must resolve all their libraries; the
# stub needs libpython3.X.so.1.0 (Debian: apt-get install -y libpython3.X). Triton itself
# may warn about missing CUDA/NVML/DCGM on a CPU-only machine: that is harmless.
pkg="$("$venv/bin/python" -c 'import pytriton, os; print(os.path.dirname(pytriton.__file__))')"
pyver="$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
missing=0
for binary in "$pkg/tritonserver/bin/tritonserver" \
              "$pkg/tritonserver/python_backend_stubs/$pyver/triton_python_backend_stub" \
              "$pkg/tritonserver/backends/python/libtriton_python.so"; do
    if ldd "$binary" | grep "not found"; then
        echo "missing libraries for $binary (see above); install them with apt-get" >&2
        missing=1
    fi
done
[[ $missing == 0 ]] || exit 1
echo "pytriton venv ready: $venv"
