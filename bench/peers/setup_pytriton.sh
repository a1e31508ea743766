#!/usr/bin/env bash
# Create bench/peers/.venvs/pytriton with NVIDIA PyTriton (it bundles a tritonserver binary),
# onnxruntime for the models, and the Debian libraries the binary links against.
# Usage: bench/peers/setup_pytriton.sh       (idempotent; apt-get needs root)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venvs/pytriton"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The wheel is manylinux_2_35 (glibc >= 2.35) and x86_64/aarch64 only.
"$venv/bin/python" -m pip install --quiet "nvidia-pytriton==0.7.0" onnxruntime
