"""``ingress_processes``: default 1, bounds checked, from YAML, environment and ``--ingress``."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.cli import build_parser
from modelyard.config.settings import ConfigError, load_settings
from tests.servers import write_config


def test_default_is_one_process() -> None:
    assert load_settings(None).ingress_processes == 1


def test_from_yaml_environment_and_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write_config(tmp_path, [], ingress_processes=3)
    assert load_settings(cfg).ingress_processes == 3
    monkeypatch.setenv("MODELYARD_INGRESS_PROCESSES", "5")
    assert load_settings(None).ingress_processes == 5
    args = build_parser().parse_args(["serve", "--ingress", "4"])
    assert load_settings(None, ingress_processes=args.ingress).ingress_processes == 4
    args = build_parser().parse_args(["serve"])
    assert args.ingress is None


@pytest.mark.parametrize("bad", [0, -1, 257, "many"])
def test_out_of_range_is_refused_with_its_name(tmp_path: Path, bad: object) -> None:
    cfg = write_config(tmp_path, [], ingress_processes=bad)
    with pytest.raises(ConfigError, match="ingress_processes"):
        load_settings(cfg)
