#!/usr/bin/env bash
# Exit 0 when the server on this host answers its readiness route with 200: the Dockerfile's
# HEALTHCHECK. Needs only the environment's Python (no curl in a slim image).
#
#   VENV=.venv          the environment whose Python runs the check
#   MODELYARD_HTTP_PORT the server's REST port (default 8080)
set -euo pipefail
VENV=${VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv}
port=${MODELYARD_HTTP_PORT:-8080}
exec "$VENV/bin/python" - "$port" <<'PY'
import sys
import urllib.request

url = f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready"
try:
    with urllib.request.urlopen(url, timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:
    print(f"not ready: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
PY
