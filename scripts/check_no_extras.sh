#!/usr/bin/env bash
# The type and import checks as they run without the optional extras (torch, llm, ray,
# xgboost, ...: only the base install and the `test` extra), beside the full environment's
# own checks in scripts/test.sh; so a user's or contributor's install without an extra
# type-checks too. .venv-notorch is a throwaway environment that sees every package of
# .venv except the extras' own distributions (not those the base or `test` need), made
# of links in about a second rather than a second install.
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
def name(req: str) -> str:
    return re.split(r"[\s;=<>!~\[]", req, maxsplit=1)[0].lower().replace("_", "-")


requires = md.requires("modelyard") or []
optional = re.compile(r"""extra\s*==\s*["'](\w[\w-]*)["']""")
kept = {name(r) for r in requires if not optional.search(r) or optional.search(r)[1] == "test"}
extra = sorted({name(r) for r in requires if optional.search(r)} - kept)
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
print(f"checks without the optional extras (hidden: {', '.join(sorted(hidden)) or 'nothing'})")
PY
.venv-notorch/bin/python -c "import torch" 2>/dev/null && { echo "torch is still importable" >&2; exit 1; }
.venv/bin/mypy --python-executable .venv-notorch/bin/python src tests
lint='import sys; from importlinter.cli import lint_imports_command as c; sys.argv[0] = "lint-imports"; c()'
.venv-notorch/bin/python -c "$lint" --no-cache >/dev/null || .venv-notorch/bin/python -c "$lint" --no-cache
