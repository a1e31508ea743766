"""The repository recognises each runtime's files, by suffix or by content."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.repository.layout import guess_runtime

FOLDERS: dict[str, tuple[dict[str, bytes], str]] = {
    "xgboost-json": ({"model.json": b'{"learner":{"attributes":{}}}'}, "xgboost"),
    "xgboost-ubj": ({"model.ubj": b"{L\x00"}, "xgboost"),
    "other-json": ({"model.onnx": b"x", "labels.json": b'{"0": "cat"}'}, "onnx"),
    "lightgbm": ({"model.txt": b"tree\nversion=v4\nnum_class=1\n"}, "lightgbm"),
    "plain-text": ({"notes.txt": b"hello", "model.skops": b"x"}, "sklearn"),
    "mlflow": ({"MLmodel": b"flavors: {}\n", "model.pkl": b"x"}, "mlflow"),
    "huggingface": (
        {"config.json": b"{}", "tokenizer.json": b"{}", "model.safetensors": b"x"},
        "huggingface",
    ),
    "state-dict": ({"model.safetensors": b"x", "net.py": b""}, "torch"),
    "exported": ({"model.pt2": b"x"}, "torch"),
}


@pytest.mark.parametrize("case", list(FOLDERS))
def test_runtime_is_guessed_from_the_newest_version(tmp_path: Path, case: str) -> None:
    files, runtime = FOLDERS[case]
    folder = tmp_path / case / "1"
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    assert guess_runtime(tmp_path / case) == runtime
