"""The base server imports no runtime extra: each library loads only in its own worker."""

from __future__ import annotations

import subprocess
import sys

import pytest

EXTRAS = ("xgboost", "lightgbm", "mlflow", "pandas", "transformers", "torch", "safetensors")

_PROBE = f"""
import sys
import modelyard.app, modelyard.runtimes, modelyard.repository.layout
from modelyard.runtimes import create_runtime
for kind in ("xgboost", "lightgbm", "mlflow", "huggingface", "torch"):
    create_runtime(kind)  # a runtime object, not yet loaded
print(sorted(m for m in {EXTRAS!r} if m in sys.modules))
"""


@pytest.mark.slow  # a fresh interpreter importing the whole server: seconds
def test_server_and_runtime_objects_import_no_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
