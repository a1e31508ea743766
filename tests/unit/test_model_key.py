"""ModelKey keeps its hash, and a key pickled in another process still finds its entry."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from modelyard.manager.records import ModelKey


def test_hash_and_order_are_those_of_the_fields() -> None:
    key = ModelKey("digits", "2")
    assert hash(key) == hash(("digits", "2"))
    assert key == ModelKey("digits", "2")
    assert ModelKey("a", "9") < ModelKey("b", "1") < ModelKey("b", "2")
    assert repr(key) == "ModelKey(name='digits', version='2')"


def test_a_key_pickled_in_another_process_finds_its_entry() -> None:
    # Each process hashes strings with its own seed: the hash must be recomputed on load.
    code = (
        "import pickle, sys; from modelyard.manager.records import ModelKey; "
        "sys.stdout.buffer.write(pickle.dumps(ModelKey('digits', '2')))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    raw = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, check=True
    ).stdout
    table = {ModelKey("digits", "2"): "found"}
    assert table[pickle.loads(raw)] == "found"
