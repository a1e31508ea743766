#!/usr/bin/env bash
# Set up from scratch, check, and run the tests.
#
#   ./scripts/test.sh            checks (ruff, mypy, import contracts, generated code), then
#                                the default suite (real servers and workers; `slow` and `gpu`
#                                tests deselected by pyproject's addopts)
#   ./scripts/test.sh --fast     ruff, then the unit tier only (tests/unit: no servers, no
#                                worker processes; about a minute on 2 cores)
#   ./scripts/test.sh -m "not gpu"   what CI runs: the slow tests too
#
# Any other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--fast" ]; then
  shift
  .venv/bin/ruff check src tests bench
  exec .venv/bin/python -m pytest tests/unit "$@"
fi
.venv/bin/ruff check src tests bench
.venv/bin/ruff format --check src tests bench
.venv/bin/mypy src tests
.venv/bin/lint-imports --no-cache >/dev/null || .venv/bin/lint-imports --no-cache
if [ -x scripts/check_proto.sh ]; then bash scripts/check_proto.sh; fi
.venv/bin/python -m pytest "$@"
