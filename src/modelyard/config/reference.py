"""The configuration reference (``docs/configuration.md``), generated from the models.

Every setting is a field of :class:`~modelyard.config.settings.ServerSettings` or of a
model nested in it, documented by the docstring written under the field. This module
renders them as one Markdown page, so the page cannot drift from the code: a test
compares the checked-in page with :func:`render_reference`. Regenerate it with::

    python -m modelyard.config.reference > docs/configuration.md

The docstrings are read from the classes' source with :mod:`ast` when the page is
rendered, not at import time (pydantic's ``use_attribute_docstrings`` would parse every
config class's source at each start of the server).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import textwrap
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from modelyard.config.settings import LOADER_FIELDS, ServerSettings

_INTRO = """\
# Configuration reference

Generated from the configuration models by `python -m modelyard.config.reference`;
do not edit by hand (a test checks that this page matches the code).

Settings come from the YAML file given to `modelyard serve --config`, then the
environment (`MODELYARD_` + the field name in capitals, `__` between nested names, e.g.
`MODELYARD_LIMITS__MAX_CONNECTIONS=500`), then the command line flags, each overriding
the one before. Sizes are in MiB (`_mb`), times in seconds (`_s`). A field the models do
not know is refused, with the nearest known name suggested.

The self-driving features, all on by default and each switched off by one field:
prefetch (`prefetch.enabled`), displacing colder models for predicted ones
(`prefetch.displace`), pre-warming before a model's usual arrival
(`prefetch.prewarm`), and the page-cache warm-up of model files
(`prefetch.page_cache`); docs/caching.md explains each.
"""


def attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """The docstring written under each field of ``model`` (and of its bases), by name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        (node,) = ast.parse(source).body
        assert isinstance(node, ast.ClassDef)
        docs.update(_docs_in(node))
    return docs


def _docs_in(node: ast.ClassDef) -> dict[str, str]:
    docs = {}
    body = node.body
    for statement, following in itertools.pairwise(body):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def _nested_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _nested_models(arg)]


def _type_name(annotation: Any) -> str:
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    text = re.sub(r"\b[a-z_][a-z_0-9]*\.", "", text)  # module prefixes: typing., devices.
    return text.replace("NoneType", "None").replace("|", "\\|")


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        try:
            value = info.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    elif info.default is PydanticUndefined:
        return "(required)"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "(see below)"
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return ", ".join(repr(v.model_dump(exclude_defaults=True)) for v in value)
    return f"`{value!r}`"


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(path: str, model: type[BaseModel], out: list[str], seen: set[str]) -> None:
    docs = attribute_docs(model)
    out += [f"## `{path}`" if path else "## Server", ""]
    if model.__doc__:
        out += [_one_line(model.__doc__), ""]
    out += ["| field | type | default | what it does |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        if model is ServerSettings and name in LOADER_FIELDS:
            continue  # set by the loader, refused in the file: not a setting
        out.append(
            f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} "
            f"| {_one_line(docs.get(name, ''))} |"
        )
        for sub in _nested_models(info.annotation):
            sub_path = f"{path}.{name}" if path else name
            if sub.__name__ not in seen:
                seen.add(sub.__name__)
                nested.append((sub_path, sub))
    out.append("")
    for sub_path, sub in nested:
        _section(sub_path, sub, out, seen)


def render_reference() -> str:
    """The whole configuration reference page, Markdown."""
    out = [_INTRO]
    _section("", ServerSettings, out, {ServerSettings.__name__})
    return "\n".join(out).rstrip() + "\n"


def field_count() -> int:
    """How many settings there are, nested ones included (one per row of the page)."""
    return render_reference().count("\n| `")


if __name__ == "__main__":
    print(render_reference(), end="")
