"""Structured logs: one JSON object per line with the record's extra fields."""

from __future__ import annotations

import logging

import orjson

from modelyard.observability.logging import JsonFormatter


def test_json_lines_carry_extras() -> None:
    record = logging.LogRecord(
        "modelyard.manager", logging.INFO, __file__, 1, "loaded %s", ("m:1",), None
    )
    record.model = "m"
    record.request_id = "r-1"
    doc = orjson.loads(JsonFormatter().format(record))
    assert doc["message"] == "loaded m:1"
    assert doc["level"] == "info"
    assert doc["logger"] == "modelyard.manager"
    assert (doc["model"], doc["request_id"]) == ("m", "r-1")
    assert doc["time"].endswith("Z")
