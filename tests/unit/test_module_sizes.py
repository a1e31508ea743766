"""No hand-written module under src/ grows past 450 lines (issue 19: one job per module)."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 450


def _is_generated(path: Path) -> bool:
    # The gRPC stubs are generated from the published proto and never edited by hand.
    return "_pb2" in path.name


def test_no_module_over_the_limit() -> None:
    modules = [path for path in SRC.rglob("*.py") if not _is_generated(path)]
    assert len(modules) > 50, "the source tree was not found"
    too_long = {
        str(path.relative_to(SRC)): count
        for path in modules
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines (split them by job): {too_long}"
