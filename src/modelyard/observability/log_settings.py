"""Triton's logging extension: read and change what the server logs, at run time.

The settings are Triton's: ``log_info``, ``log_warning``, ``log_error`` (each level on
or off), ``log_verbose_level`` (above 0: debug records too) and ``log_format``
(``default`` or ``ISO8601``: how the timestamp of the text format is written).
``log_file`` is always ``""`` (the server logs to stderr): a request may not make the
server write to a path of its choosing, so a non-empty ``log_file`` is refused by name,
like any unknown setting or a value of the wrong type.

One :class:`LevelGate` filter on the root logger's handlers applies the flags; the root
logger's level follows the most verbose level left on, so records nobody wants are not
even built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from modelyard.errors import InvalidInputError

_FORMATS = {
    "default": "%H:%M:%S",
    "ISO8601": "%Y-%m-%dT%H:%M:%S",
}
_BOOLS = ("log_info", "log_warning", "log_error")


class LevelGate(logging.Filter):
    """Drops the records of the levels switched off (errors include critical ones)."""

    def __init__(self) -> None:
        super().__init__("modelyard.log_settings")
        self.info = True
        self.warning = True
        self.error = True
        self.verbose = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """True to keep ``record``."""
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0


class LogSettings:
    """The logging extension's settings over the process's root logger."""

    def __init__(self, root: logging.Logger | None = None) -> None:
        self._root = root or logging.getLogger()
        self._gate = LevelGate()
        self._format = "default"

    def as_dict(self) -> dict[str, Any]:
        """The settings as Triton reports them."""
        gate = self._gate
        return {
            "log_file": "",
            "log_info": gate.info,
            "log_warning": gate.warning,
            "log_error": gate.error,
            "log_verbose_level": gate.verbose,
            "log_format": self._format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (all checked first: none applied if one is refused); the
        settings now."""
        for key, value in changes.items():
            _check(key, value)
        gate = self._gate
        for key in _BOOLS:
            if key in changes:
                setattr(gate, key.removeprefix("log_"), changes[key])
        if "log_verbose_level" in changes:
            gate.verbose = changes["log_verbose_level"]
        if "log_format" in changes:
            self._format = changes["log_format"]
        self._apply()
        return self.as_dict()

    def _apply(self) -> None:
        gate = self._gate
        for handler in self._root.handlers:
            if gate not in handler.filters:
                handler.addFilter(gate)
            formatter = handler.formatter
            if formatter is not None and formatter.datefmt in _FORMATS.values():
                formatter.datefmt = _FORMATS[self._format]
        if gate.verbose > 0:
            self._root.setLevel(logging.DEBUG)
        elif gate.info:
            self._root.setLevel(logging.INFO)
        elif gate.warning:
            self._root.setLevel(logging.WARNING)
        else:
            self._root.setLevel(logging.ERROR)


def _check(key: str, value: object) -> None:
    if key in _BOOLS:
        if not isinstance(value, bool):
            raise InvalidInputError(f"log setting {key!r} must be true or false")
    elif key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31:
            raise InvalidInputError(f"log setting {key!r} must be a non-negative integer")
    elif key == "log_format":
        if value not in _FORMATS:
            raise InvalidInputError(
                f"log setting {key!r} must be one of {', '.join(_FORMATS)}, got {value!r}"
            )
    elif key == "log_file":
        if value != "":
            raise InvalidInputError(
                "log setting 'log_file' is not supported: the server logs to stderr, and a "
                "request may not choose a file for it to write"
            )
    else:
        raise InvalidInputError(
            f"unknown log setting {key!r}; settings are: log_file, {', '.join(_BOOLS)}, "
            "log_verbose_level, log_format"
        )
