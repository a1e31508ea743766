"""docs/configuration.md is generated from the configuration models and kept current.

The page is rendered in a fresh interpreter: rendering parses the models' source with
``ast``, and CPython 3.11 can refuse that (``SystemError: AST constructor recursion depth
mismatch``) in a process where an earlier test caught a RecursionError (the deep-nesting
input tests do).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

_UNDOCUMENTED = """
import json
from modelyard.config.model_config import ModelConfig
from modelyard.config.reference import attribute_docs
from modelyard.config.settings import ServerSettings
print(json.dumps({
    m.__name__: sorted(set(m.model_fields) - set(attribute_docs(m)))
    for m in (ServerSettings, ModelConfig)
}))
"""


def _python(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def page() -> str:
    return _python("-m", "modelyard.config.reference")


def test_the_checked_in_page_matches_the_code(page: str) -> None:
    assert PAGE.read_text(encoding="utf-8") == page, (
        "docs/configuration.md is stale: python -m modelyard.config.reference "
        "> docs/configuration.md"
    )


def test_every_field_has_its_docstring() -> None:
    undocumented = json.loads(_python("-c", _UNDOCUMENTED))
    assert undocumented == {"ServerSettings": [], "ModelConfig": []}


def test_nested_models_have_their_own_sections(page: str) -> None:
    for section in ("## `limits`", "## `models`", "## `models.generation`", "## `security`"):
        assert section in page
