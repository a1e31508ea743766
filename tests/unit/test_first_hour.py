"""What a new user meets first: a quick `--help`, the YAML typo's nearest field, the
example's list of what it left out."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.cli import NO_CONFIG_NOTICE, _left_out, build_parser
from modelyard.config.settings import ConfigError, load_settings

# numpy, pydantic and the runtimes cost most of a second of CPU to import: none of them
# may be imported just to print help or to build the parser of the client verbs.
_HEAVY = ("numpy", "pydantic", "onnxruntime", "modelyard.config", "aiohttp")


@pytest.mark.parametrize("argv", [["--help"], ["models", "--help"], ["example", "--help"]])
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    probe = (
        "import sys\n"
        "from modelyard.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {_HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_serve_option_has_help() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    missing = [a.dest for a in serve._actions if a.dest != "help" and not a.help]
    assert missing == []


def test_a_yaml_typo_names_the_nearest_field(tmp_path: Path) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(
        "http_prot: 9000\nmodels:\n  - {name: a, path: a, memroy_mb: 4}\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg)
    message = str(caught.value)
    assert "http_prot: Extra inputs are not permitted; did you mean 'http_port'?" in message
    assert "models.0.memroy_mb" in message
    assert "did you mean 'memory_mb'?" in message


def test_a_field_far_from_every_name_gets_no_guess(tmp_path: Path) -> None:
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text("zzqqxx: 1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(cfg)
    assert "zzqqxx: Extra inputs are not permitted" in str(caught.value)
    assert "did you mean" not in str(caught.value)


def test_the_example_says_what_it_left_out_and_why() -> None:
    args = argparse.Namespace(no_llm=True, no_minilm=True)
    lines = _left_out(args)
    assert lines == [
        "left out: the GGUF text generators (--no-llm)",
        "left out: the MiniLM encoder (--no-minilm)",
    ]


def test_serve_without_a_config_says_how_to_get_one(tmp_path: Path) -> None:
    # A bind address that cannot be bound ends the start at once, after the notice.
    out = subprocess.run(
        [sys.executable, "-m", "modelyard.cli", "serve", "--host", "256.0.0.1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode != 0
    assert NO_CONFIG_NOTICE in out.stderr


# The verbs import their modules lazily, so each may be the first modelyard module a
# process imports: an import cycle hidden by the usual order would break that verb.
_VERB_MODULES = [
    "modelyard.repository.layout",
    "modelyard.repository.manifest",
    "modelyard.simulation.plan",
    "modelyard.examples.repository",
    "modelyard.manager.eviction",
    "modelyard.config.settings",
    "modelyard.ray_app",
]


@pytest.mark.parametrize("module", _VERB_MODULES)
def test_each_verbs_module_imports_first(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
