"""The repository recognises each runtime's files, by suffix or by content."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelyard.repository.runtime_guess import (
    UnsupportedModelFormatError,
    guess_runtime,
    infer_runtime,
)

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
    "onnx-export": (
        {"model.onnx": b"x", "config.json": b"{}", "tokenizer.json": b"{}"},
        "onnx",
    ),
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


FILES: dict[str, tuple[bytes, str]] = {
    "model.gguf": (b"GGUF", "llama_cpp"),
    "model.onnx": (b"x", "onnx"),
    "model.pt2": (b"x", "torch"),
    "model.pt": (b"x", "torch"),
    "model.ubj": (b"{L\x00", "xgboost"),
    "model.json": (b'{"learner":{}}', "xgboost"),
    "model.txt": (b"tree\nversion=v4\n", "lightgbm"),
    "model.skops": (b"x", "sklearn"),
}


@pytest.mark.parametrize("name", list(FILES))
def test_runtime_is_inferred_from_a_single_file(tmp_path: Path, name: str) -> None:
    data, runtime = FILES[name]
    (tmp_path / name).write_bytes(data)
    guess = infer_runtime(tmp_path / name)
    assert guess.runtime == runtime
    assert name in guess.reason  # the log line names the file that decided


def test_a_file_not_written_yet_is_judged_by_its_suffix(tmp_path: Path) -> None:
    assert infer_runtime(tmp_path / "later" / "model.gguf").runtime == "llama_cpp"


def test_a_causal_lm_folder_is_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "lm" / "1"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(b"x")
    assert guess_runtime(tmp_path / "lm") == "transformers"


def test_an_ascend_om_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.om").write_bytes(b"x")
    for path in (tmp_path / "m", tmp_path / "m" / "1" / "model.om"):
        with pytest.raises(UnsupportedModelFormatError, match=r"not supported: Ascend \.om"):
            infer_runtime(path)
