"""``modelyard serve --ray``: the flag sets Ray mode and keeps the YAML's other keys."""

from __future__ import annotations

from pathlib import Path

from modelyard.cli import build_parser, with_ray
from modelyard.config.settings import load_settings


def test_the_ray_flag_sets_the_address_and_keeps_the_yaml_block(tmp_path: Path) -> None:
    config = tmp_path / "modelyard.yaml"
    config.write_text("ray:\n  budget_share: 0.5\n  shared_workers: true\n", encoding="utf-8")
    args = build_parser().parse_args(["serve", "--config", str(config), "--ray", "10.0.0.1:6379"])
    settings = with_ray(load_settings(args.config), args.ray)
    assert settings.ray is not None
    assert settings.ray.address == "10.0.0.1:6379"
    assert settings.ray.budget_share == 0.5
    assert settings.ray.shared_workers


def test_without_the_flag_or_the_block_the_server_runs_on_one_host() -> None:
    args = build_parser().parse_args(["serve"])
    assert args.ray is None
    assert load_settings(None).ray is None
    assert with_ray(load_settings(None), "auto").ray is not None
