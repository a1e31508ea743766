#!/usr/bin/env bash
# Create .venv and install modelyard with its test tools (and the torch extra for MiniLM).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="test,llm"
if [ "${MODELYARD_NO_TORCH:-0}" != "1" ]; then extras="test,torch,llm"; fi
# The llm extra compiles llama.cpp (llama-cpp-python has no CPU wheel on PyPI): skip its
# multimodal library, which modelyard does not use and which is most of the build. pip
# keeps the built wheel in its cache, so a machine that keeps ~/.cache/pip builds it once.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
.venv/bin/python -m pip install -q -e ".[${extras}]"
