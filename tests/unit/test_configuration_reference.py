"""docs/configuration.md is generated from the configuration models and kept current."""

from __future__ import annotations

from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.reference import attribute_docs, render_reference
from modelyard.config.settings import ServerSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_checked_in_page_matches_the_code() -> None:
    assert PAGE.read_text(encoding="utf-8") == render_reference(), (
        "docs/configuration.md is stale: python -m modelyard.config.reference "
        "> docs/configuration.md"
    )


def test_every_field_has_its_docstring() -> None:
    for model in (ServerSettings, ModelConfig):
        docs = attribute_docs(model)
        undocumented = sorted(set(model.model_fields) - set(docs))
        assert undocumented == [], f"{model.__name__}: {undocumented}"


def test_nested_models_have_their_own_sections() -> None:
    page = render_reference()
    for section in ("## `limits`", "## `models`", "## `models.generation`", "## `security`"):
        assert section in page
