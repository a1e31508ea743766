#!/usr/bin/env bash
# Set up, build the example model repository locally, and serve it on 127.0.0.1:8080.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/modelyard example example-repo
echo
echo "try:  curl -s -X POST localhost:8080/predict -H 'content-type: application/json' \\"
echo "        -d '{\"model\": \"iris-logreg\", \"inputs\": {\"input\": [5.1, 3.5, 1.4, 0.2]}}'"
echo
exec .venv/bin/modelyard serve --config example-repo/modelyard.yaml "$@"
