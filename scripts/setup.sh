#!/usr/bin/env bash
# Create .venv with everything the tests need: modelyard in editable mode with every extra
# listed in scripts/test-extras.txt (MODELYARD_NO_TORCH=1 leaves out the extras that pull torch).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' scripts/test-extras.txt | grep -v '^$' || true)
if [ "${MODELYARD_NO_TORCH:-0}" = "1" ]; then extras=$(grep -vxE 'torch|huggingface' <<<"$extras" || true); fi
EXTRAS=$(paste -sd, - <<<"$extras") EDITABLE=1 bash scripts/install.sh
