#!/usr/bin/env bash
# Create .venv and install modelyard with its test tools (and the torch extra for MiniLM).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
extras="test,llm"
if [ "${MODELYARD_NO_TORCH:-0}" != "1" ]; then extras="test,torch,llm"; fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
