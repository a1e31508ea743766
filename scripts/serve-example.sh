#!/usr/bin/env bash
# Install modelyard (no extras unless $EXTRAS names them, e.g. EXTRAS=torch for MiniLM),
# build the example model repository, and serve it on 127.0.0.1:8080. Arguments go to
# `modelyard serve` (e.g. --http-port 9000).
#
#   EXAMPLE_DIR=example-repo    where the example repository is built
#   SKIP_INSTALL=1              use the environment as it is (it must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export VENV
if [ "${SKIP_INSTALL:-0}" != "1" ]; then bash scripts/install.sh; fi
dir=${EXAMPLE_DIR:-example-repo}
"$VENV/bin/modelyard" example "$dir"
echo
echo "try:  curl -s -X POST localhost:8080/predict -H 'content-type: application/json' \\"
echo "        -d '{\"model\": \"iris-logreg\", \"inputs\": {\"input\": [5.1, 3.5, 1.4, 0.2]}}'"
echo
exec bash scripts/serve.sh --config "$dir/modelyard.yaml" "$@"
