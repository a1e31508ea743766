"""Version labels: which folder names are versions, and how versions are ordered.

A version folder's name is one or more numbers joined by ``.``, ``-`` or ``_``:
``1``, ``12``, ``1.3``, ``2.10.1``, ``2024-11-01``, ``20241101_2``. Anything else
(hidden folders, ``tokenizer/``, ``v2``) is not a version.

Order (what "newest" means for ``version_policy.latest`` and the default version):
the numbers compared as numbers, left to right, a label that runs out first being the
older (``1 < 1.0 < 1.2 < 1.10 < 2``; ``2024-09-30 < 2024-11-01``). Labels of equal
numbers written two ways (``1.3``, ``1-3``, ``01.3``) are ordered by their spelling; a
request names a version by its folder's exact name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

VERSION_LABEL_PATTERN = r"^\d{1,20}(?:[._\-]\d{1,20}){0,7}$"
"""Up to eight numbers of up to 20 digits, joined by ``.``, ``-`` or ``_``."""
_LABEL = re.compile(VERSION_LABEL_PATTERN)
_SEPARATORS = re.compile(r"[._\-]")

VersionKey = tuple[int, ...]
"""A label's numbers: what versions are compared by."""


def is_version_label(name: str) -> bool:
    """True when ``name`` is a version folder's name (see the module doc)."""
    return _LABEL.fullmatch(name) is not None


def version_key(label: str) -> VersionKey:
    """The numbers of ``label``, for ordering; ValueError if it is not a version label."""
    if not is_version_label(label):
        raise ValueError(f"{label!r} is not a version label (numbers joined by '.', '-' or '_')")
    return tuple(int(part) for part in _SEPARATORS.split(label))


def order_key(label: str) -> tuple[bool, VersionKey, str]:
    """Sort key of a version: by its numbers, then its spelling (a name that is not a
    label, which no folder scan yields, sorts before every version)."""
    if not is_version_label(label):
        return (False, (), label)
    return (True, version_key(label), label)


def sort_versions(labels: Iterable[str]) -> list[str]:
    """``labels`` oldest first."""
    return sorted(labels, key=order_key)


def newest_version(labels: Iterable[str]) -> str:
    """The newest of ``labels`` (non-empty)."""
    return max(labels, key=order_key)
