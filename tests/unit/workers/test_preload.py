"""Which modules the fork server imports before forking, per declared runtime."""

from __future__ import annotations

from modelyard.workers.factory import WorkerFactory
from modelyard.workers.forkserver import DEFAULT_PRELOAD, RUNTIME_PRELOAD, preload_for


def test_a_repository_without_llms_preloads_the_defaults_only() -> None:
    assert preload_for(["onnx", "python", "onnx"]) == DEFAULT_PRELOAD
    assert preload_for([]) == DEFAULT_PRELOAD


def test_llama_cpp_models_add_llama_cpp_and_its_backend_start_once() -> None:
    got = preload_for(["onnx", "llama_cpp", "llama_cpp"])
    assert got[: len(DEFAULT_PRELOAD)] == DEFAULT_PRELOAD
    assert got[len(DEFAULT_PRELOAD) :] == RUNTIME_PRELOAD["llama_cpp"]
    assert "modelyard.runtimes.llama_cpp:prepare_fork_server" in got
    assert len(set(got)) == len(got)


def test_the_server_s_factory_preloads_for_the_declared_runtimes() -> None:
    assert WorkerFactory.for_runtimes(["onnx"]).config.preload == DEFAULT_PRELOAD
    llm = WorkerFactory.for_runtimes(["onnx", "llama_cpp"]).config.preload
    assert llm == preload_for(["llama_cpp"])


def test_a_repository_with_skops_models_has_the_fork_server_import_skops() -> None:
    # skops.io imports all of scikit-learn: paid by the fork server, not a first request.
    assert "skops.io" in preload_for(["sklearn"])
    assert "skops.io" not in preload_for(["onnx"])
