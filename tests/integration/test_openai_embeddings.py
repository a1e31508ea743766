"""``/v1/embeddings`` through the stock ``openai`` client equals the encoder's own output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelyard.examples.minilm import minilm_available
from modelyard.examples.repository import build_text_encoder
from tests.servers import running_server, write_config

pytest.importorskip("openai", reason="the test extra installs the openai client")
import openai

pytestmark = [
    pytest.mark.skipif(
        not minilm_available(), reason="needs the torch extra (scripts/setup.sh installs it)"
    ),
    pytest.mark.slow,  # exporting MiniLM to ONNX takes half a minute or more
]

TEXTS = ["A cat sits on the mat.", "Inference servers keep many models available.", "ok"]


async def test_openai_embeddings_equal_the_encoders_own_vectors(tmp_path: Path) -> None:
    build_text_encoder(tmp_path / "repo" / "minilm-text" / "1" / "model.onnx")
    models = [
        {
            "name": "minilm-text",
            "path": "minilm-text",
            "runtime": "python",
            "class": "modelyard.examples.text_encoder:TextEncoder",
            "timeout_s": 20,
        }
    ]
    cfg = write_config(tmp_path, models, model_repository=str(tmp_path / "repo"))
    async with running_server(cfg) as (app, client):
        stock = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
        )
        try:
            assert [m.id for m in (await stock.models.list()).data] == ["minilm-text"]
            # The client asks for base64 by default and decodes it itself.
            answer = await stock.embeddings.create(model="minilm-text", input=TEXTS)
            floats = await stock.embeddings.create(
                model="minilm-text", input=TEXTS[0], encoding_format="float"
            )
            with pytest.raises(openai.BadRequestError) as info:
                await stock.embeddings.create(model="minilm-text", input="x", dimensions=64)
            assert info.value.param == "dimensions"
        finally:
            await stock.close()
        # The model's own answer over the KServe v2 route, for the same texts.
        body = {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": TEXTS}]}
        r = await client.post("/v2/models/minilm-text/infer", json=body)
        assert r.status_code == 200, r.text
        outputs = {o["name"]: o for o in r.json()["outputs"]}
        expected = np.array(outputs["embedding"]["data"], dtype=np.float32).reshape(3, 384)
        tokens = outputs["tokens"]["data"]
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert [d.index for d in answer.data] == [0, 1, 2]
    np.testing.assert_array_equal(got, expected)  # float32 both ways: bit for bit
    np.testing.assert_allclose(np.array(floats.data[0].embedding), expected[0], atol=1e-6)
    assert answer.model == "minilm-text"
    assert answer.usage.prompt_tokens == sum(tokens) > len(TEXTS)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens
