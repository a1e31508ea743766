"""Text in, embedding out: the MiniLM encoder behind ``/predict {"text": ...}``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelyard.examples.minilm import minilm_available, reference_embeddings
from modelyard.examples.repository import build_text_encoder
from tests.servers import running_server, write_config

pytestmark = pytest.mark.skipif(
    not minilm_available(), reason="needs the torch extra (scripts/setup.sh installs it)"
)

TEXTS = ["A cat sits on the mat.", "Inference servers keep many models available."]


async def test_text_goes_in_and_sentence_embeddings_come_out(tmp_path: Path) -> None:
    build_text_encoder(tmp_path / "repo" / "minilm-text" / "1" / "model.onnx")
    models = [
        {
            "name": "minilm-text",
            "path": "minilm-text",
            "runtime": "python",
            "class": "modelyard.examples.text_encoder:TextEncoder",
            "timeout_ms": 20_000,
        }
    ]
    cfg = write_config(tmp_path, models, model_repository=str(tmp_path / "repo"))
    expected = reference_embeddings(TEXTS)
    async with running_server(cfg) as (_, client):
        r = await client.post("/predict", json={"model": "minilm-text", "text": TEXTS[0]})
        assert r.status_code == 200, r.text
        got = np.array(r.json()["outputs"]["embedding"], dtype=np.float32)
        assert got.shape == (1, 384)
        np.testing.assert_allclose(got[0], expected[0], atol=1e-4)
        body = {
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": TEXTS}],
        }
        r = await client.post("/v2/models/minilm-text/infer", json=body)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        assert out["shape"] == [2, 384]
        np.testing.assert_allclose(
            np.array(out["data"], dtype=np.float32).reshape(2, 384), expected, atol=1e-4
        )
