"""Model and version names as they arrive from clients: checked before any lookup.

A name is used as a dictionary key, a metric label and (for a model the YAML does
not declare) a folder of the repository, so it is held to a conservative pattern:
no separators, no dot-dot, no control characters, at most 128 characters.
"""

from __future__ import annotations

import re

from modelyard.errors import InvalidInputError

MAX_NAME_LENGTH = 128
"""Longest model, version or alias name."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
"""Letters, digits, ``_ . -``; the first a letter or digit (so never ``..``)."""
_NAME = re.compile(NAME_PATTERN)


def check_model_name(name: object) -> str:
    """``name`` if it is a valid model name; InvalidInputError (HTTP 400) if not."""
    return _check(name, "model name")


def check_version_name(version: object) -> str | None:
    """A version or alias from a request (``None``/empty: the default); 400 if malformed."""
    if version is None or version == "":
        return None
    return _check(version, "version")


def _check(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"a {what} must be a non-empty string")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidInputError(
            f"{what} is {len(value)} characters long; at most {MAX_NAME_LENGTH} are allowed"
        )
    if _NAME.fullmatch(value) is None:
        raise InvalidInputError(
            f"{what} {value[:40]!r} is not allowed: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit"
        )
    return value
