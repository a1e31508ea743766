"""The repository extension's load parameters that modelyard refuses by name."""

from __future__ import annotations

from collections.abc import Iterable

from modelyard.errors import InvalidInputError


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
