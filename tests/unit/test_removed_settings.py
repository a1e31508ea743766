"""``ingress_processes`` was removed: 1 still loads (what it meant by default), any other
value is refused with a message saying what to use instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.cli import build_parser
from modelyard.config.settings import ConfigError, load_settings
from tests.servers import write_config


def test_ingress_processes_one_still_loads(tmp_path: Path) -> None:
    settings = load_settings(write_config(tmp_path, [], ingress_processes=1))
    assert not hasattr(settings, "ingress_processes")


@pytest.mark.parametrize("value", [2, 8, 0])
def test_other_ingress_processes_values_name_the_removal_and_ray(
    tmp_path: Path, value: int
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write_config(tmp_path, [], ingress_processes=value))
    message = str(info.value)
    assert "ingress_processes" in message
    assert "removed" in message
    assert "Ray" in message


def test_the_ingress_flag_is_gone() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--ingress", "2"])
