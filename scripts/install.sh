#!/usr/bin/env bash
# Install modelyard (and the extras named in $EXTRAS) into a virtual environment. The one
# install step of every way to run it: scripts/serve-example.sh, scripts/setup.sh (tests
# and CI) and the Dockerfile all call this script, so the image cannot drift from what CI
# tests.
#
#   VENV=.venv          the environment (created with $PYTHON if missing)
#   EXTRAS=""           comma-separated extras, e.g. "torch" or "test,torch"
#   EDITABLE=1          install the source tree in editable mode (0: a normal install)
#   COMPILE=0           1: compile every module's byte-code at install time
#   PIP_CACHE_DIR       pip's cache, wheels built from source included (pip's default)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-}
EDITABLE=${EDITABLE:-1}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# An editable install stays current as the sources change: only a changed pyproject.toml
# or another set of extras needs pip again (a second serve-example.sh starts at once).
stamp="$VENV/.modelyard-install"
want="$(sha256sum pyproject.toml | cut -d' ' -f1) extras=[$EXTRAS]"
if [ "$EDITABLE" = "1" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
rm -f "$stamp"
# Quiet and without progress bars, so the output reads well in a log.
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
pip=("$VENV/bin/python" -m pip -q)
# The pip that venv bundles (Python 3.11: pip 23) installs pyproject projects, editable
# ones too; upgrading it first costs a download and several seconds of a first run.
# Byte-code is compiled on first import for the modules really used, not for every
# module of every dependency at install time (a third of the install's CPU time);
# COMPILE=1 compiles everything now (an image whose files its user cannot write).
# An extra built from source (llama-cpp-python compiles llama.cpp with CMake) uses every
# core; pip keeps the wheel it built in its cache, so later installs take seconds.
# Its multimodal library (mtmd), unused by modelyard, is most of that build: skipped.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}
compile=--no-compile
if [ "${COMPILE:-0}" = "1" ]; then compile=--compile; fi
target=.
if [ -n "$EXTRAS" ]; then target=".[${EXTRAS}]"; fi
# pip runs quietly; a line a minute says it is still working. PyPI publishes
# llama-cpp-python as source only (no wheel for this platform), so the first install
# with the llm extra compiles llama.cpp: 3-4 minutes on two idle cores, much longer on
# busy ones; pip caches the wheel it built, so later installs take seconds.
case ",$EXTRAS," in
  *,llm,*) note=" (the llm extra compiles llama.cpp from source on a first install: minutes)" ;;
  *) note="" ;;
esac
echo "install.sh: installing modelyard${EXTRAS:+ [$EXTRAS]} into $VENV$note"
(
  minutes=0
  while sleep 60; do
    minutes=$((minutes + 1))
    echo "install.sh: still installing ($minutes min)"
  done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
if [ "$EDITABLE" = "1" ]; then
  "${pip[@]}" install "$compile" -e "$target"
else
  "${pip[@]}" install "$compile" "$target"
fi
echo "install.sh: installed"
[ "$EDITABLE" = "1" ] && echo "$want" >"$stamp"
exit 0
