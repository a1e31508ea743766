"""pyproject.toml builds without deprecation banners, and the extras CI installs exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_license_is_an_spdx_string_the_build_backend_understands() -> None:
    # A `license = {text = ...}` table makes setuptools >= 77 print a deprecation banner
    # on every install; the SPDX string needs setuptools 77 or newer to build.
    doc = _pyproject()
    project = doc["project"]
    assert isinstance(project, dict)
    assert project["license"] == "Apache-2.0"
    build = doc["build-system"]
    assert isinstance(build, dict)
    (setuptools,) = [r for r in build["requires"] if r.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)", setuptools)
    assert match is not None
    assert int(match.group(1)) >= 77


def test_every_extra_listed_for_the_tests_exists() -> None:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    extras = set(project["optional-dependencies"])
    listed = {
        line.split("#", 1)[0].strip()
        for line in (ROOT / "scripts" / "test-extras.txt").read_text().splitlines()
    } - {""}
    assert {"test", "torch"} <= listed
    assert listed <= extras, f"scripts/test-extras.txt names unknown extras: {listed - extras}"
