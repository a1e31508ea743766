"""The route table of docs/protocol.md lists exactly the HTTP routes the server serves.

The first cell of each row names routes in backticks: ``METHOD /path`` (several methods
as ``GET``/``POST /path``), an optional part in brackets (``/v2/models/{m}[/versions/{v}]``
is two routes), and ``/sibling`` for the previous path with its last segment replaced
(``POST /v2/repository/models/{m}/load``, ``/unload``). Path parameters match whatever
their names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from modelyard.app import App
from modelyard.config.settings import load_settings
from modelyard.frontends.http.app import create_app

PAGE = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})

Endpoint = tuple[str, str]
"""(method, path with every parameter written ``{}``)."""


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _expand(path: str) -> list[str]:
    """Both spellings of each ``[optional]`` part."""
    match = re.search(r"\[([^\]]*)\]", path)
    if match is None:
        return [path]
    head, tail = path[: match.start()], path[match.end() :]
    return _expand(head + tail) + _expand(head + match.group(1) + tail)


def _api_table(text: str) -> list[str]:
    """First cells of the rows of the table under ``## REST routes``."""
    section = text.split("\n## REST routes\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, "no route table in docs/protocol.md"
    return [row.split(" | ", 1)[0] for row in rows]


def parse_cell(cell: str) -> set[Endpoint]:
    """The endpoints one first cell names (see the module docstring)."""
    found: set[Endpoint] = set()
    pending: list[str] = []
    methods: list[str] = []
    last = ""
    for chunk in re.findall(r"`([^`]+)`", cell):
        words = chunk.split()
        if len(words) == 1 and words[0] in METHODS:
            pending.append(words[0])
            continue
        if len(words) == 2 and words[0] in METHODS:
            methods, last = [*pending, words[0]], words[1]
            pending = []
        elif len(words) == 1 and chunk.startswith("/") and last:
            last = last.rsplit("/", 1)[0] + chunk
        else:
            pytest.fail(f"route table: cannot read {chunk!r} in {cell!r}")
        for path in _expand(last):
            found |= {(m, _normal(path)) for m in methods}
    return found


def _documented_endpoints() -> set[Endpoint]:
    endpoints: set[Endpoint] = set()
    for cell in _api_table(PAGE.read_text(encoding="utf-8")):
        endpoints |= parse_cell(cell)
    return endpoints


def _served_endpoints(tmp_path: Path) -> set[Endpoint]:
    # The composition App.start() serves, built without starting anything.
    config = tmp_path / "modelyard.yaml"
    config.write_text("model_repository: .\n", encoding="utf-8")
    app = App(load_settings(config))
    asgi: object = create_app(app.dataplane, 1 << 20, app.extra_routes())
    while not isinstance(asgi, Starlette):  # under the fast path and the body limits
        asgi = next(getattr(asgi, a) for a in ("fallback", "app", "data") if hasattr(asgi, a))
    served: set[Endpoint] = set()
    for route in asgi.routes:
        assert isinstance(route, Route), route
        # Starlette adds HEAD to every GET route by itself.
        served |= {(m, _normal(route.path)) for m in route.methods or () if m != "HEAD"}
    return served


def test_the_cell_syntax_reads_as_documented() -> None:
    cell = "`GET`/`POST /v2/models/{m}[/versions/{v}]/x`, `/y`"
    assert parse_cell(cell) == {
        (method, path)
        for method in ("GET", "POST")
        for path in (
            "/v2/models/{}/x",
            "/v2/models/{}/versions/{}/x",
            "/v2/models/{}/y",
            "/v2/models/{}/versions/{}/y",
        )
    }


def test_route_table_lists_every_route_and_only_those(tmp_path: Path) -> None:
    served = _served_endpoints(tmp_path)
    documented = _documented_endpoints()
    assert ("GET", "/v2/stats/timeseries") in served
    assert sorted(served - documented) == [], "routes missing from the route table"
    assert sorted(documented - served) == [], "the route table lists routes not served"
