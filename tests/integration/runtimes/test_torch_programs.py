"""PyTorch: ``torch.export`` programs, TorchScript and safetensors state dicts saved with
torch's and safetensors' own save functions; results equal the module's own output."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (CI installs it)")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="needs the torch extra")

from modelyard.repository.runtime_guess import guess_runtime  # noqa: E402
from modelyard.runtimes.safetensors_mmap import mmap_state_dict  # noqa: E402
from tests.integration.runtimes.served import (  # noqa: E402
    infer,
    load_inline,
    serving,
    tensors_of,
    triton_metadata,
)

# Exporting a program and starting a worker that imports torch take seconds: CI runs these.
pytestmark = pytest.mark.slow

NET_SOURCE = '''
import torch


class Net(torch.nn.Module):
    """4 features in, 3 class probabilities out."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(4, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(torch.relu(self.hidden(features))), dim=-1)
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``exported`` (.pt2), ``scripted`` (.pt) and ``weights`` (.safetensors + net.py)."""
    root = tmp_path_factory.mktemp("torch")
    weights = root / "weights" / "1"
    weights.mkdir(parents=True)
    (weights / "net.py").write_text(NET_SOURCE, encoding="utf-8")
    sys.path.insert(0, str(weights))
    net = importlib.import_module("net")  # written into the version folder above

    torch.manual_seed(0)
    module = net.Net().eval()
    safetensors_torch.save_file(module.state_dict(), weights / "model.safetensors")
    example = torch.randn(2, 4)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(module, (example,), dynamic_shapes={"features": {0: batch}})
    (root / "exported" / "1").mkdir(parents=True)
    torch.export.save(program, root / "exported" / "1" / "model.pt2")
    (root / "scripted" / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(root / "scripted" / "1" / "model.pt"))
    yield root
    # The runtime put the folder on sys.path too (as a worker does): leave no trace.
    while str(weights) in sys.path:
        sys.path.remove(str(weights))
    sys.modules.pop("net", None)


def _reference(repo: Path, x: np.ndarray) -> np.ndarray:
    net = importlib.import_module("net")  # written by the repo fixture

    module = net.Net().eval()
    module.load_state_dict(
        safetensors_torch.load_file(repo / "weights" / "1" / "model.safetensors")
    )
    with torch.inference_mode():
        out: np.ndarray = module(torch.from_numpy(x)).numpy()
    return out


X = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)


def test_exported_program_carries_its_own_metadata(repo: Path) -> None:
    runtime = load_inline("torch", repo / "exported" / "1")
    assert [(t.name, t.datatype, t.shape) for t in runtime.inputs] == [
        ("features", "FP32", (-1, 4))
    ]
    assert [(t.name, t.datatype, t.shape) for t in runtime.outputs] == [
        ("softmax", "FP32", (-1, 3))
    ]
    out = runtime.infer({"features": X})
    np.testing.assert_allclose(out["softmax"], _reference(repo, X), rtol=1e-6)


def test_torchscript_names_its_inputs_and_options_give_shapes(repo: Path) -> None:
    runtime = load_inline("torch", repo / "scripted" / "1")
    assert [t.name for t in runtime.inputs] == ["features"]
    shaped = load_inline(
        "torch",
        repo / "scripted" / "1",
        options={"inputs": "features:FP32:-1x4", "outputs": "probs:FP32:-1x3"},
    )
    assert shaped.inputs[0].shape == (-1, 4)
    out = shaped.infer({"features": X})
    np.testing.assert_allclose(out["probs"], _reference(repo, X), rtol=1e-6)


def test_safetensors_weights_are_memory_mapped(repo: Path) -> None:
    path = repo / "weights" / "1" / "model.safetensors"
    mapped = mmap_state_dict(path)
    expected = safetensors_torch.load_file(path)
    assert set(mapped) == set(expected)
    for name, value in expected.items():
        assert torch.equal(mapped[name], value)
    maps = Path("/proc/self/maps").read_text(encoding="utf-8")
    assert str(path.resolve()) in maps, "the weights should be a mapping of the file"
    runtime = load_inline("torch", repo / "weights" / "1", python_class="net:Net")
    assert [(t.name, t.shape) for t in runtime.inputs] == [("input", (-1, 4))]
    assert [(t.name, t.shape) for t in runtime.outputs] == [("output", (-1, 3))]
    np.testing.assert_allclose(
        runtime.infer({"input": X})["output"], _reference(repo, X), rtol=1e-6
    )
    assert guess_runtime(repo / "weights") == "torch"


def test_state_dict_without_a_class_is_refused_with_a_reason(repo: Path) -> None:
    with pytest.raises(ValueError, match="class: module:Class"):
        load_inline("torch", repo / "weights" / "1")


async def test_served_torch_models_answer_like_the_module(repo: Path, tmp_path: Path) -> None:
    models: list[dict[str, Any]] = [
        {"name": "exported", "path": "exported", "runtime": "torch", "preload": True},
        {
            "name": "weights",
            "path": "weights",
            "runtime": "torch",
            "class": "net:Net",
            "preload": True,
        },
    ]
    async with serving(repo, models, tmp_path) as (app, client):
        exported = await infer(client, "exported", {"features": X})
        weights = await infer(client, "weights", {"input": X})
        meta = await triton_metadata(app, "exported")
    reference = _reference(repo, X)
    np.testing.assert_allclose(exported["softmax"], reference, rtol=1e-6)
    np.testing.assert_allclose(weights["output"], reference, rtol=1e-6)
    assert tensors_of(meta, "inputs") == [("features", "FP32", [-1, 4])]
    assert tensors_of(meta, "outputs") == [("softmax", "FP32", [-1, 3])]
