"""modelyard.yaml validation: every mistake names the file, the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.config.settings import ConfigError, load_settings

BAD = [
    ("negative-memory", "models:\n  - {name: a, path: a, memory_mb: -1}\n", "models.0.memory_mb"),
    ("unknown-field", "models:\n  - {name: a, path: a, colour: red}\n", "models.0.colour"),
    ("bad-runtime", "models:\n  - {name: a, path: a, runtime: tf}\n", "models.0.runtime"),
    ("bad-name", "models:\n  - {name: 'a b', path: a}\n", "models.0.name"),
    ("python-no-class", "models:\n  - {name: a, path: a, runtime: python}\n", "needs 'class"),
    ("dup-names", "models:\n  - {name: a, path: a}\n  - {name: a, path: b}\n", "repeated: a"),
    ("bad-port", "http_port: 70000\n", "http_port"),
    ("unknown-device", "models:\n  - {name: a, path: a, device: 'cuda:0'}\n", "unknown device"),
    ("not-a-mapping", "- 1\n- 2\n", "top level must be a mapping"),
    ("bad-yaml", "models: [\n", "not valid YAML"),
    ("negative-spares", "spare_workers: -1\n", "spare_workers"),
    # Internal settings the loader derives from the file's path (issue 33): `config_dir: /etc`
    # used to move every relative path there.
    ("internal-config-dir", "config_dir: /etc\n", "'config_dir' cannot be set in the file"),
    ("internal-config-file", "config_file: x.yaml\n", "'config_file' cannot be set"),
    (
        "base-unknown",
        "models:\n  - {name: a, path: a, runtime: llama_cpp, base: b}\n",
        "base names unknown model 'b'",
    ),
    ("base-not-llama", "models:\n  - {name: a, path: a, base: b}\n", "needs runtime llama_cpp"),
    ("base-itself", "models:\n  - {name: a, path: a, runtime: llama_cpp, base: a}\n", "own base"),
    (
        "base-an-adapter",
        "models:\n  - {name: a, path: a, runtime: llama_cpp}\n"
        "  - {name: b, path: b, runtime: llama_cpp, base: a}\n"
        "  - {name: c, path: c, runtime: llama_cpp, base: b}\n",
        "not itself an adapter",
    ),
    (
        "base-replicas",
        "models:\n  - {name: a, path: a, runtime: llama_cpp}\n"
        "  - {name: b, path: b, runtime: llama_cpp, base: a, replicas: {max: 2}}\n",
        "takes no replicas",
    ),
]


@pytest.mark.parametrize(("text", "fragment"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_mistakes_are_reported(tmp_path: Path, text: str, fragment: str) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert str(cfg) in str(info.value)
    assert fragment in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml")


def test_precedence_flags_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("http_port: 1000\ngrpc_port: 2000\nlog_level: debug\n", encoding="utf-8")
    monkeypatch.setenv("MODELYARD_GRPC_PORT", "3000")
    monkeypatch.setenv("MODELYARD_HTTP_PORT", "4000")
    s = load_settings(cfg, http_port=5000)
    assert (s.http_port, s.grpc_port, s.log_level) == (5000, 3000, "debug")


def test_relative_paths_resolve_from_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "sub" / "modelyard.yaml"
    cfg.parent.mkdir()
    cfg.write_text("model_repository: repo\nmodels:\n  - {name: a, path: a}\n", encoding="utf-8")
    s = load_settings(cfg)
    assert s.model_path(s.models[0]) == (tmp_path / "sub" / "repo" / "a").resolve()


ENV_MISTAKES = [
    ("MODELYARD_HTTP_PORT", "abc", "http_port"),
    ("MODELYARD_LIMITS__MAX_CONNECTIONS", "-1", "limits.max_connections"),
    ("MODELYARD_DEVICES", "not json", "'devices' takes a JSON list"),
]


@pytest.mark.parametrize(("variable", "value", "fragment"), ENV_MISTAKES)
def test_environment_mistakes_name_the_variable_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, fragment: str
) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("http_port: 1000\n", encoding="utf-8")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    message = str(info.value)
    assert f"environment variable {variable}={value!r}" in message
    assert fragment in message
    assert str(cfg) not in message


def test_file_and_environment_mistakes_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("log_level: loud\n", encoding="utf-8")
    monkeypatch.setenv("MODELYARD_HTTP_PORT", "abc")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    lines = str(info.value).splitlines()
    # Each mistake sits under the place to fix it.
    file_at = lines.index(f"{cfg}: invalid configuration")
    env_at = lines.index("environment variable MODELYARD_HTTP_PORT='abc': invalid configuration")
    assert lines[file_at + 1].startswith("  log_level:")
    assert lines[env_at + 1].startswith("  http_port:")


@pytest.mark.parametrize("word", ["off", "OFF", "", "null", "none", "false"])
def test_grpc_can_be_turned_off_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, word: str
) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("grpc_port: 2000\n", encoding="utf-8")
    monkeypatch.setenv("MODELYARD_GRPC_PORT", word)
    assert load_settings(cfg).grpc_port is None
    # A flag still wins over the environment.
    assert load_settings(cfg, grpc_port=3000).grpc_port == 3000


def test_grpc_off_flag_and_flag_mistakes_name_the_flag(tmp_path: Path) -> None:
    from modelyard.cli import build_parser

    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("grpc_port: 2000\n", encoding="utf-8")
    args = build_parser().parse_args(["serve", "--config", str(cfg), "--grpc-port", "off"])
    assert load_settings(cfg, grpc_port=args.grpc_port).grpc_port is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--grpc-port", "eighty"])
    with pytest.raises(ConfigError) as info:
        load_settings(cfg, http_port=70000)
    assert str(info.value).startswith("--http-port: invalid configuration")
    assert str(cfg) not in str(info.value)


@pytest.mark.parametrize(
    ("text", "spares"),
    [
        ("", 1),
        ("devices: [{name: 'cpu:0'}, {name: 'cpu:1'}, {name: 'cpu:2'}]\n", 3),
        ("spare_workers: 0\n", 0),
        ("spare_workers: 2\n", 2),
    ],
    ids=["default-one-device", "default-per-core-set", "off", "explicit"],
)
def test_spare_workers_default_to_one_per_device(tmp_path: Path, text: str, spares: int) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(text, encoding="utf-8")
    assert load_settings(cfg).spare_worker_count == spares
