"""Triton's logging extension over loggers of the test's own (never the process's root)."""

from __future__ import annotations

import itertools
import logging

import pytest

from modelyard.errors import InvalidInputError
from modelyard.observability.log_settings import LogSettings


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.levelname)


_names = itertools.count()


def _logger() -> tuple[logging.Logger, Collect]:
    # A fresh logger of its own each time, not propagating: the root is left alone.
    logger = logging.getLogger(f"modelyard-test.log-settings.{next(_names)}")
    logger.propagate = False
    handler = Collect()
    logger.addHandler(handler)
    return logger, handler


def _log_each(logger: logging.Logger) -> None:
    logger.debug("d")
    logger.info("i")
    logger.warning("w")
    logger.error("e")


def test_defaults_and_switching_levels_off_and_on() -> None:
    logger, handler = _logger()
    settings = LogSettings(logger)
    assert settings.as_dict() == {
        "log_file": "",
        "log_info": True,
        "log_warning": True,
        "log_error": True,
        "log_verbose_level": 0,
        "log_format": "default",
    }
    settings.update({"log_info": False, "log_warning": False})
    _log_each(logger)
    assert handler.seen == ["ERROR"]
    handler.seen.clear()
    now = settings.update({"log_info": True, "log_verbose_level": 1})
    assert now["log_verbose_level"] == 1
    _log_each(logger)
    assert handler.seen == ["DEBUG", "INFO", "ERROR"]  # warnings are still off


def test_iso8601_changes_the_text_formats_timestamp() -> None:
    logger, handler = _logger()
    LogSettings(logger).update({"log_format": "ISO8601"})
    assert handler.formatter is not None
    assert handler.formatter.datefmt == "%Y-%m-%dT%H:%M:%S"


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"log_file": "/tmp/x.log"}, "'log_file'"),
        ({"log_info": 1}, "'log_info'"),
        ({"log_verbose_level": -1}, "'log_verbose_level'"),
        ({"log_verbose_level": True}, "'log_verbose_level'"),
        ({"log_format": "json"}, "'log_format'"),
        ({"log_colour": True}, "'log_colour'"),
    ],
)
def test_bad_settings_are_refused_by_name_and_change_nothing(
    changes: dict[str, object], named: str
) -> None:
    logger, _ = _logger()
    settings = LogSettings(logger)
    before = settings.as_dict()
    with pytest.raises(InvalidInputError, match=named):
        settings.update({"log_info": False, **changes})
    assert settings.as_dict() == before
