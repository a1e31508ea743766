#!/usr/bin/env bash
# Install modelyard (and the extras named in $EXTRAS) into a virtual environment. The one
# install step of every way to run it: scripts/serve-example.sh, scripts/setup.sh (tests
# and CI) and the Dockerfile all call this script, so the image cannot drift from what CI
# tests.
#
#   VENV=.venv          the environment (created with $PYTHON if missing)
#   EXTRAS=""           comma-separated extras, e.g. "torch" or "test,torch"
#   EDITABLE=1          install the source tree in editable mode (0: a normal install)
#   PIP_CACHE_DIR       pip's cache, wheels built from source included (pip's default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-}
EDITABLE=${EDITABLE:-1}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# Quiet and without progress bars, so the output reads well in a log.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
pip=("$VENV/bin/python" -m pip -q)
"${pip[@]}" install --upgrade pip
target=.
if [ -n "$EXTRAS" ]; then target=".[${EXTRAS}]"; fi
if [ "$EDITABLE" = "1" ]; then
  "${pip[@]}" install -e "$target"
else
  "${pip[@]}" install "$target"
fi
