"""The repository extension's load parameters: ``config``, and those refused by name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from modelyard.errors import InvalidInputError
from modelyard.protocol.documents import json_object


def check_load_parameters(names: Iterable[str]) -> None:
    """Refuse Triton's ``file:<path>`` load parameters, naming the field (REST and gRPC).

    modelyard's repository is closed: a version's files come from the repository's own
    folders, checked against their manifest, never from a request's bytes. Ignoring the
    field would answer 200 while the old model keeps serving, so it is a 400 instead
    (docs/protocol.md)."""
    for name in names:
        if name.startswith("file:"):
            raise InvalidInputError(
                f"load parameter {name!r} is not supported: model files are loaded from the "
                "repository's version folders, never from a load request"
            )


def load_config(config: object) -> Mapping[str, Any] | None:
    """The ``config`` load parameter (a JSON string, as Triton's clients send it, or an
    object) as a mapping of model fields (None: not given)."""
    if config is None:
        return None
    if isinstance(config, str | bytes):
        text = config.encode() if isinstance(config, str) else config
        try:
            return json_object(text, allow_empty=False)
        except InvalidInputError as exc:
            raise InvalidInputError(f"load parameter 'config': {exc.message}") from None
    if not isinstance(config, Mapping):
        raise InvalidInputError("load parameter 'config' must be a JSON object of model fields")
    return config
