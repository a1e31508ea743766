"""JSON documents of the protocol that are not tensors (request bodies, load configs)."""

from __future__ import annotations

from typing import Any

import orjson

from modelyard.errors import InvalidInputError


def json_object(body: bytes, *, allow_empty: bool) -> dict[str, Any]:
    """A request body that must be a JSON object (``{}`` for an empty one if allowed)."""
    if not body.strip():
        if allow_empty:
            return {}
        raise InvalidInputError("request body is empty")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInputError("request body must be a JSON object")
    return doc
