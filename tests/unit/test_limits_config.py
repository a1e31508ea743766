"""The ``limits:`` and ``remote_load:`` blocks: defaults, validation, the descriptor check."""

from __future__ import annotations

import logging
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.config.limits import LimitsConfig
from modelyard.config.settings import ConfigError, load_settings
from modelyard.frontends.http.server_config import descriptors_needed, rest_connection_cap
from tests.servers import write_config


def test_defaults_are_closed_and_bounded(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, []))
    remote = settings.remote_load
    assert remote.enabled
    assert not any(
        (
            remote.allow_code,
            remote.allow_trusted,
            remote.allow_inline,
            remote.allow_pinned,
            remote.allow_runtime_options,
            remote.allow_other_folder,
            remote.allow_reconfigure_declared,
        )
    )
    assert remote.min_priority == 3
    assert settings.limits.header_timeout_s > 0
    # Unset: the REST cap is derived from the file limit, within the REST port's share.
    assert settings.limits.max_connections is None
    cap = rest_connection_cap(settings.limits)
    assert descriptors_needed(cap) < resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2


@pytest.mark.parametrize(
    ("block", "bad"),
    [
        ("remote_load", {"allow_everything": True}),
        ("remote_load", {"min_priority": 0}),
        ("limits", {"max_request_elements": 0}),
        ("limits", {"header_timeout_s": 0}),
        ("limits", {"max_conections": 10}),
    ],
)
def test_mistakes_in_the_blocks_name_the_field(
    tmp_path: Path, block: str, bad: dict[str, object]
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write_config(tmp_path, [], **{block: bad}))
    assert f"{block}.{next(iter(bad))}" in str(info.value)


def test_the_file_limit_is_raised_for_the_cap_or_the_cap_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        with caplog.at_level(logging.WARNING, logger="modelyard"):
            assert rest_connection_cap(LimitsConfig(max_connections=512)) == 512
            assert not caplog.records
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 512 + 64 + 128 + 256
            rest_connection_cap(LimitsConfig(max_connections=hard))  # beyond the hard limit
        assert "limits.max_connections" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_default_cap_follows_the_file_limit() -> None:
    # In a child process (a hard limit once lowered cannot be raised back): with the
    # hard limit at 1,200 the soft one cannot grow, so the cap shrinks to fit half of
    # what is left after the server's own descriptors.
    code = (
        "import resource\n"
        "from modelyard.config.limits import LimitsConfig\n"
        "from modelyard.frontends.http.server_config import rest_connection_cap\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (1200, 1200))\n"
        "print(rest_connection_cap(LimitsConfig()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    low = int(out.stdout)
    assert low > 100
    assert descriptors_needed(low) <= (1200 - 256) // 2
