"""The ``limits:`` and ``remote_load:`` blocks: defaults, validation, the descriptor check."""

from __future__ import annotations

import logging
import resource
from pathlib import Path

import pytest

from modelyard.config.settings import ConfigError, load_settings
from modelyard.frontends.http.server_config import ensure_descriptor_room
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
    assert settings.limits.max_connections < resource.getrlimit(resource.RLIMIT_NOFILE)[0]


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
            ensure_descriptor_room(512)  # needs about 512 + 64 + 128 + 256
            assert not caplog.records
            assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 512 + 64 + 128 + 256
            ensure_descriptor_room(hard)  # more than the hard limit allows
        assert "limits.max_connections" in caplog.text
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
