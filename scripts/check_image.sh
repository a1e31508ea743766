#!/usr/bin/env bash
# The container image's steps, run the way the Dockerfile runs them, so that the image
# cannot drift from what CI tests (CI has no docker daemon): scripts/install.sh as a
# normal, compiled install into a new environment (extras from $EXTRAS, none by default),
# scripts/serve.sh on the example repository, then scripts/healthcheck.sh until the
# readiness route answers. With DOCKER=1 and a docker daemon it builds and runs the
# image itself instead. Binds 127.0.0.1 only, with a throwaway management token.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
started=$(date +%s)
if [ "${DOCKER:-0}" = "1" ]; then
  docker build -q -t modelyard-check --build-arg EXTRAS="${EXTRAS:-}" . >/dev/null
  mkdir -p "$work/models"
  docker run --rm -d --name "modelyard-check-$port" -p "127.0.0.1:$port:8080" \
    -e MODELYARD_SECURITY__MANAGEMENT_TOKEN="$token" --entrypoint bash modelyard-check \
    -c 'VENV=/opt/modelyard/venv; $VENV/bin/modelyard example /tmp/models --no-minilm >/dev/null && exec bash scripts/serve.sh --config /tmp/models/modelyard.yaml' >/dev/null
  for _ in $(seq 1 240); do
    status=$(docker inspect -f '{{.State.Health.Status}}' "modelyard-check-$port")
    [ "$status" = healthy ] && break
    sleep 1
  done
  docker rm -f "modelyard-check-$port" >/dev/null
  [ "$status" = healthy ] || { echo "image never became healthy" >&2; exit 1; }
  echo "image: healthy after $(( $(date +%s) - started )) s"
  exit 0
fi
VENV="$work/venv" EXTRAS="${EXTRAS:-}" EDITABLE=0 COMPILE=1 bash scripts/install.sh
installed=$(date +%s)
"$work/venv/bin/modelyard" example "$work/models" --no-minilm >/dev/null
export VENV="$work/venv" MODELYARD_HOST=127.0.0.1 MODELYARD_HTTP_PORT="$port" \
  MODELYARD_GRPC_PORT=off MODELYARD_LOG_FORMAT=json MODELYARD_SECURITY__MANAGEMENT_TOKEN="$token"
if bash scripts/healthcheck.sh 2>/dev/null; then
  echo "something already answers on port $port" >&2
  exit 1
fi
bash scripts/serve.sh --config "$work/models/modelyard.yaml" >"$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 480); do
  if bash scripts/healthcheck.sh 2>/dev/null; then
    echo "image steps: installed in $(( installed - started )) s, healthy after $(( $(date +%s) - started )) s"
    exit 0
  fi
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.5
done
cat "$work/serve.log" >&2
echo "scripts/serve.sh never became ready" >&2
exit 1
