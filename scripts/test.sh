#!/usr/bin/env bash
# Set up from scratch, check, and run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy src tests
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
if [ -x scripts/check_proto.sh ]; then bash scripts/check_proto.sh; fi
.venv/bin/python -m pytest "$@"
