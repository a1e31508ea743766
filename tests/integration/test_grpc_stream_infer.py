"""``ModelStreamInfer`` with stock ``tritonclient.grpc`` (``start_stream`` /
``async_stream_infer``): a generative model's tokens arrive as a stream of responses, the
last flagged ``triton_final_response``; an ordinary model answers once per request; a bad
request is answered in the stream, which goes on; a client that cancels the stream stops
the generation in the worker."""

from __future__ import annotations

import asyncio
import queue
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from modelyard.examples.mlp import build_add_onnx
from modelyard.frontends.grpc.convert import request_to_proto
from modelyard.frontends.grpc.proto import grpc_predict_v2_pb2_grpc as pb_grpc
from modelyard.protocol.types import InferInput, InferRequest
from tests.integration.llm_models import N_TOKENS, PROMPT, llm_model
from tests.polling import wait_until
from tests.servers import running_server, write_config

pytest.importorskip("llama_cpp", reason="the llm extra runs GGUF models")
pytest.importorskip("gguf", reason="the llm extra writes the test models")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="the test extra has tritonclient")

Result = tuple[Any, Any]
"""(InferResult | None, InferenceServerException | None), as the stream callback gets them."""


def _text_request() -> list[Any]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    return [text]


def _add_request() -> list[Any]:
    tensor = grpcclient.InferInput("input", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


def _final(result: Any) -> bool:
    params = result.get_response().parameters
    return bool(params["triton_final_response"].bool_param)


def _stream(port: int, send: list[dict[str, Any]], answers: int) -> list[Result]:
    """Send every request of ``send`` on one stream; collect ``answers`` callbacks."""
    got: queue.Queue[Result] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        for request in send:
            client.async_stream_infer(**request)
        results = [got.get(timeout=60) for _ in range(answers)]
        client.stop_stream()
        return results
    finally:
        client.close()


async def test_tokens_stream_and_ordinary_models_answer_once(llm_root: Path) -> None:
    build_add_onnx(llm_root / "add" / "1" / "model.onnx", 1.0)
    config = write_config(
        llm_root,
        [llm_model("llama-a"), {"name": "add", "path": "add"}],
        devices=[{"name": "cpu", "memory_budget_mb": 1024}],
    )
    async with running_server(config, grpc=True) as (app, client):
        assert app.grpc_port is not None
        body = {"text_input": PROMPT, "parameters": {"max_tokens": N_TOKENS, "temperature": 0}}
        r = await client.post("/v2/models/llama-a/generate", json=body)
        assert r.status_code == 200, r.text
        whole = r.json()["text_output"]

        # An int: the tritonclient that installs beside protobuf 7 (2.41) sends bool, int
        # and str parameters only; the server reads any number for temperature.
        sampling = {"max_tokens": N_TOKENS, "temperature": 0}
        generate: dict[str, Any] = {"model_name": "llama-a", "inputs": _text_request()}
        generate |= {"parameters": sampling, "request_id": "g1"}
        results = await asyncio.to_thread(_stream_until_final, app.grpc_port, generate)
        assert all(error is None for _, error in results), results
        assert len(results) > 1, "the tokens came in one response, not as a stream"
        assert [_final(r) for r, _ in results] == [False] * (len(results) - 1) + [True]
        pieces = [r.as_numpy("text_output")[0].decode() for r, _ in results]
        assert "".join(pieces) == whole
        last = results[-1][0].get_response()
        assert last.id == "g1"
        assert last.parameters["finish_reason"].string_param == "length"
        assert last.parameters["completion_tokens"].int64_param == N_TOKENS

        # An ordinary model: one response per request; a bad request is answered in the
        # stream (error_message) and the next request is still served.
        add = {"model_name": "add", "inputs": _add_request()}
        unknown = {"model_name": "no-such-model", "inputs": _add_request()}
        answers = await asyncio.to_thread(_stream, app.grpc_port, [add, unknown, add], 3)
        (r1, e1), (r2, e2), (r3, e3) = answers
        assert e1 is None, e1
        assert e3 is None, e3
        assert r2 is None
        assert e2 is not None
        assert "no-such-model" in e2.message()
        expected = np.arange(4, dtype=np.float32).reshape(1, 4) + 1
        np.testing.assert_array_equal(r1.as_numpy("output"), expected)
        np.testing.assert_array_equal(r3.as_numpy("output"), expected)

        # A generative model answered whole over unary ModelInfer, tritonclient's infer.
        unary = await asyncio.to_thread(_infer_text, app.grpc_port, sampling)
        assert unary == whole


def _stream_until_final(port: int, request: dict[str, Any]) -> list[Result]:
    got: queue.Queue[Result] = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    results: list[Result] = []
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(**request)
        while len(results) < 4 * N_TOKENS:
            result, error = got.get(timeout=60)
            results.append((result, error))
            if error is not None or _final(result):
                break
        client.stop_stream()
        return results
    finally:
        client.close()


def _infer_text(port: int, sampling: dict[str, Any]) -> str:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        result = client.infer("llama-a", _text_request(), parameters=sampling)
        text: str = result.as_numpy("text_output")[0].decode()
        return text
    finally:
        client.close()


@pytest.mark.slow
async def test_a_cancelled_stream_stops_generation_in_the_worker(llm_root: Path) -> None:
    model = llm_model("llama-a", generation={"n_ctx": 4096})
    config = write_config(llm_root, [model], devices=[{"name": "cpu", "memory_budget_mb": 1024}])
    async with running_server(config, grpc=True) as (app, _):
        request = request_to_proto(
            InferRequest(
                "llama-a",
                None,
                [
                    InferInput(
                        "text_input", "BYTES", (1,), np.array([PROMPT.encode()], dtype=object)
                    )
                ],
            )
        )
        request.parameters["max_tokens"].int64_param = 4000
        request.parameters["temperature"].double_param = 0.0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
            call = stub.ModelStreamInfer(iter([request]))
            seen = 0
            async for answer in call:
                assert not answer.error_message
                seen += 1
                if seen == 5:
                    call.cancel()  # the client goes away mid-answer
                    break

        async def no_active_sequence() -> bool:
            return (await app.dataplane.generation_counters("llama-a")).active == 0

        await wait_until(no_active_sequence, what="the worker dropped the sequence")
        before = (await app.dataplane.generation_counters("llama-a")).generated_tokens
        await asyncio.sleep(0.5)
        after = (await app.dataplane.generation_counters("llama-a")).generated_tokens
        assert after == before, "the worker kept generating for a client that left"
        assert before < 1000
