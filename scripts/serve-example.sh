#!/usr/bin/env bash
# Install modelyard (no extras unless $EXTRAS names them, e.g. EXTRAS=torch for MiniLM),
# build the example model repository, and serve it on 127.0.0.1:8080. Arguments go to
# `modelyard serve` (e.g. --http-port 9000 for another port). EXTRAS=llm adds the GGUF
# text generators (OpenAI API), EXTRAS=torch the MiniLM encoder; EXTRAS=llm,torch both.
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
# The port the server will listen on, for the hint below: --http-port N among the
# arguments, else the default.
port=8080
prev=""
for arg in "$@"; do
  case "$arg" in
    --http-port=*) port=${arg#--http-port=} ;;
    *) if [ "$prev" = "--http-port" ]; then port=$arg; fi ;;
  esac
  prev=$arg
done
echo
echo "try:  curl -s -X POST localhost:$port/predict -H 'content-type: application/json' \\"
echo "        -d '{\"model\": \"iris-logreg\", \"inputs\": {\"input\": [5.1, 3.5, 1.4, 0.2]}}'"
echo
exec bash scripts/serve.sh --config "$dir/modelyard.yaml" "$@"
