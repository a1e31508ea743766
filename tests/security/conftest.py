"""Security tests start real servers on the integration tests' model repository."""

from __future__ import annotations

from tests.integration.conftest import model_root

__all__ = ["model_root"]
