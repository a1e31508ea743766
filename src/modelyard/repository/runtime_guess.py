"""Which runtime serves a model, read from its files when ``runtime:`` is not written.

A model path is a model folder (``<model>/<version>/<files>``, the newest version's files
decide), a version folder, or one file. The decision, first match wins:

1. marker files: ``MLmodel`` → ``mlflow``; ``config.json`` beside safetensors or tokenizer
   files (and no ``.onnx``: an ONNX export keeps both beside its graph) →
   ``transformers`` when the config's architecture is a causal LM (``…ForCausalLM``),
   else ``huggingface``;
2. first bytes, for suffixes too common to trust: a ``.json`` starting with XGBoost's
   ``{"learner"`` → ``xgboost``; a ``.txt`` starting with LightGBM's ``tree\\nversion=``
   → ``lightgbm``;
3. suffixes: ``.gguf`` → ``llama_cpp``, ``.onnx``, ``.skops``/``.pkl``/``.joblib`` →
   ``sklearn``, ``.pt``/``.pt2`` (TorchScript, torch.export) and bare ``.safetensors``
   → ``torch``, ``.ubj`` → ``xgboost``;
4. nothing recognised: ``onnx`` (the default before inference existed), said as such.

An Ascend offline model (``.om``) is refused by name: no runtime here runs one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelyard.repository.layout import list_versions, version_dir

DEFAULT_RUNTIME = "onnx"
"""What a model gets when nothing in its files says otherwise."""

UNSUPPORTED_SUFFIXES = {
    ".om": "Ascend .om (an offline model for Huawei Ascend NPUs, which need CANN); "
    "convert the source model to ONNX or GGUF instead",
}
"""Model files known by their suffix that no runtime here can serve, and why."""

_BY_SUFFIX = (
    (".gguf", "llama_cpp"),
    (".onnx", "onnx"),
    (".skops", "sklearn"),
    (".pkl", "sklearn"),
    (".joblib", "sklearn"),
    (".pt2", "torch"),
    (".pt", "torch"),
    (".ubj", "xgboost"),
    (".safetensors", "torch"),
)


class UnsupportedModelFormatError(ValueError):
    """The model's files are a format no runtime here serves (an Ascend ``.om``)."""


@dataclass(frozen=True, slots=True)
class RuntimeGuess:
    """The runtime chosen and the file or marker that chose it (for the log)."""

    runtime: str
    reason: str


def _head(path: Path, size: int = 256) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(size)
    except OSError:
        return b""


def _is_causal_lm(config_file: Path) -> bool:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    archs = config.get("architectures") if isinstance(config, dict) else None
    return isinstance(archs, list) and any(str(a).endswith("ForCausalLM") for a in archs)


def _by_markers(folder: Path, names: list[str]) -> RuntimeGuess | None:
    if "MLmodel" in names:
        return RuntimeGuess("mlflow", "an MLmodel file (MLflow)")
    if any(n.endswith(".onnx") for n in names):
        return None  # an ONNX export keeps its config and tokenizer beside the graph
    if "config.json" in names and any(
        n.endswith(".safetensors")
        or n.startswith(("tokenizer", "vocab"))
        or n == "preprocessor_config.json"
        for n in names
    ):
        if _is_causal_lm(folder / "config.json"):
            return RuntimeGuess("transformers", "config.json of a causal LM (…ForCausalLM)")
        return RuntimeGuess("huggingface", "config.json with weights or a tokenizer")
    return None


def _by_file(path: Path) -> RuntimeGuess | None:
    """The runtime of one file, by its first bytes or its suffix; None if unknown."""
    name = path.name
    suffix = path.suffix.lower()
    if suffix in UNSUPPORTED_SUFFIXES:
        raise UnsupportedModelFormatError(f"{name}: not supported: {UNSUPPORTED_SUFFIXES[suffix]}")
    if suffix == ".json" and _head(path).lstrip().startswith(b'{"learner"'):
        return RuntimeGuess("xgboost", f"{name} is an XGBoost JSON booster")
    if suffix == ".txt" and _head(path).startswith(b"tree\nversion="):
        return RuntimeGuess("lightgbm", f"{name} is a LightGBM text model")
    for known, runtime in _BY_SUFFIX:
        if suffix == known:
            return RuntimeGuess(runtime, f"{name} ({known})")
    return None


def _files_of(path: Path) -> tuple[Path, list[str]]:
    """The folder whose files decide, and their names: the newest version's, or ``path``'s."""
    versions = list_versions(path)
    folder = version_dir(path, versions[-1]) if versions else path
    try:
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
    except OSError:
        names = []
    return folder, names


def _known_files(
    folder: Path, names: list[str]
) -> tuple[list[RuntimeGuess], UnsupportedModelFormatError | None]:
    """What each file is known as; an unsupported file matters only when alone."""
    found: list[RuntimeGuess] = []
    unsupported: UnsupportedModelFormatError | None = None
    for name in names:
        try:
            guess = _by_file(folder / name)
        except UnsupportedModelFormatError as exc:
            unsupported = exc
            continue
        if guess is not None:
            found.append(guess)
    return found, unsupported


def guess_runtime(path: Path) -> str:
    """The runtime name :func:`infer_runtime` chooses for ``path``."""
    return infer_runtime(path).runtime


def infer_runtime(path: Path) -> RuntimeGuess:
    """The runtime for the model at ``path`` (a model folder, a version folder or a file).

    UnsupportedModelFormatError for a format no runtime serves (``.om``); a path that does
    not exist is judged by its suffix alone.
    """
    if path.is_dir():
        return _infer_from_folder(path)
    if path.suffix.lower() == ".safetensors" and path.with_name("config.json").is_file():
        by_marker = _by_markers(path.parent, ["config.json", path.name])
        if by_marker is not None:
            return by_marker
    single = _by_file(path)
    if single is not None:
        return single
    return RuntimeGuess(DEFAULT_RUNTIME, f"{path.name}: suffix not known")


def _infer_from_folder(path: Path) -> RuntimeGuess:
    folder, names = _files_of(path)
    by_marker = _by_markers(folder, names)
    if by_marker is not None:
        return by_marker
    found, unsupported = _known_files(folder, names)
    for _, runtime in _BY_SUFFIX:  # the suffix order decides between several files
        for guess in found:
            if guess.runtime == runtime:
                return guess
    if found:
        return found[0]
    if unsupported is not None:
        raise unsupported
    return RuntimeGuess(DEFAULT_RUNTIME, f"no known model file in {folder.name}/")
