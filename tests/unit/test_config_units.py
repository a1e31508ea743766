"""One unit per kind: times in seconds, sizes in MiB; the older names load the same value."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config.settings import ConfigError, ServerSettings, load_settings

MIB = 1024 * 1024

OLD = """
max_request_bytes: 3145728
limits: {max_control_body_bytes: 524288, max_response_bytes: 1000}
models:
  - name: a
    path: a
    timeout_ms: 1500
    load_timeout_ms: 300
    latency_slo_ms: 50
    max_queue_delay_us: 500
"""

NEW = """
max_request_mb: 3
limits: {max_control_body_mb: 0.5, max_response_mb: 0.00095367431640625}
models:
  - name: a
    path: a
    timeout_s: 1.5
    load_timeout_s: 0.3
    latency_slo_s: 0.05
    max_queue_delay_s: 0.0005
"""


def _load(tmp_path: Path, text: str) -> ServerSettings:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(text, encoding="utf-8")
    return load_settings(cfg)


def test_older_names_and_new_names_load_to_the_same_values(tmp_path: Path) -> None:
    old, new = _load(tmp_path, OLD), _load(tmp_path, NEW)
    assert old.models == new.models
    assert old.limits == new.limits
    assert old.max_request_mb == new.max_request_mb == 3.0
    m = new.models[0]
    assert (m.timeout_s, m.load_timeout_s, m.latency_slo_s, m.max_queue_delay_s) == (
        1.5,
        0.3,
        0.05,
        0.0005,
    )
    # The code reads sizes in bytes, exactly what the older byte-valued names said.
    assert old.max_request_bytes == new.max_request_bytes == 3 * MIB
    assert old.limits.max_control_body_bytes == new.limits.max_control_body_bytes == 524288
    assert old.limits.max_response_bytes == new.limits.max_response_bytes == 1000


def test_defaults_are_unchanged_by_the_new_units() -> None:
    s = ServerSettings()
    assert s.max_request_bytes == 64 * MIB
    assert s.limits.max_control_body_bytes == MIB
    assert s.limits.max_response_bytes == 64 * MIB
    m = ServerSettings.model_validate({"models": [{"name": "a", "path": "a"}]}).models[0]
    assert (m.timeout_s, m.load_timeout_s, m.max_queue_delay_s, m.latency_slo_s) == (
        10.0,
        120.0,
        0.0,
        None,
    )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("models:\n  - {name: a, path: a, timeout_ms: 5, timeout_s: 1}\n", "'timeout_ms', not"),
        ("max_request_bytes: 10\nmax_request_mb: 1\n", "'max_request_bytes', not both"),
        ("limits: {max_response_bytes: 1, max_response_mb: 1}\n", "'max_response_bytes'"),
        ("models:\n  - {name: a, path: a, timeout_ms: -5}\n", "models.0.timeout_s"),
        ("models:\n  - {name: a, path: a, timeout_ms: soon}\n", "models.0.timeout_s"),
    ],
    ids=["both-names", "both-top-level", "both-in-limits", "negative-old", "not-a-number-old"],
)
def test_mistakes_with_older_names_are_reported(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="invalid configuration") as info:
        _load(tmp_path, text)
    assert fragment in str(info.value)
