#!/usr/bin/env bash
# The type and import checks as they run without the optional torch extra (the README's
# MODELYARD_NO_TORCH=1 set-up), beside the full environment's own checks in scripts/test.sh.
# .venv-notorch is a throwaway environment that sees every package of .venv except the
# extra's own distributions, made of links in about a second rather than a second install.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .venv-notorch
.venv/bin/python -m venv --without-pip .venv-notorch
.venv/bin/python - <<'PY'
import importlib.metadata as md
import re
import sysconfig
from pathlib import Path

full = Path(sysconfig.get_paths()["purelib"])
bare = Path(".venv-notorch") / full.relative_to(sysconfig.get_paths()["data"])
extra = [
    re.split(r"[\s;=<>!~\[]", req, maxsplit=1)[0]
    for req in md.requires("modelyard") or []
    if re.search(r"""extra\s*==\s*["']torch["']""", req)
]
hidden: set[str] = set()
for name in extra:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    hidden |= {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] != ".."}
for item in full.iterdir():
    if item.name not in hidden:
        (bare / item.name).symlink_to(item.resolve())
print(f"checks without the torch extra (hidden: {', '.join(sorted(hidden)) or 'nothing'})")
PY
.venv-notorch/bin/python -c "import torch" 2>/dev/null && { echo "torch is still importable" >&2; exit 1; }
.venv/bin/mypy --python-executable .venv-notorch/bin/python src tests
lint='import sys; from importlinter.cli import lint_imports_command as c; sys.argv[0] = "lint-imports"; c()'
.venv-notorch/bin/python -c "$lint" --no-cache >/dev/null || .venv-notorch/bin/python -c "$lint" --no-cache
