"""OpenAI-compatible answers: response bodies, stream chunks and the error object.

Plain dictionaries, built the way OpenAI's API spells them, so that the stock
``openai`` client parses them unchanged. Nothing here knows about HTTP.
"""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any

import numpy as np

from modelyard.errors import ErrorCode, ServerError

_ERROR_TYPES: dict[ErrorCode, str] = {
    ErrorCode.MODEL_NOT_FOUND: "invalid_request_error",
    ErrorCode.INVALID_INPUT: "invalid_request_error",
    ErrorCode.PAYLOAD_TOO_LARGE: "invalid_request_error",
    ErrorCode.STATE_CONFLICT: "invalid_request_error",
    ErrorCode.NOT_SUPPORTED: "invalid_request_error",
    ErrorCode.UNAUTHENTICATED: "authentication_error",
    ErrorCode.PERMISSION_DENIED: "permission_error",
    ErrorCode.OVERLOADED: "rate_limit_error",
    ErrorCode.MEMORY_BUDGET: "server_error",
    ErrorCode.MODEL_NOT_READY: "server_error",
    ErrorCode.MODEL_LOAD_FAILED: "server_error",
    ErrorCode.WORKER_CRASHED: "server_error",
    ErrorCode.CIRCUIT_OPEN: "server_error",
    ErrorCode.DEADLINE_EXCEEDED: "timeout_error",
    ErrorCode.CANCELLED: "invalid_request_error",
    ErrorCode.INTERNAL: "server_error",
}


def error_object(exc: ServerError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` for ``exc``.

    ``code`` is modelyard's error code (``model_not_found``, ``invalid_input``,
    ``overloaded`` …), ``param`` the request field at fault when one is known.
    """
    return {
        "error": {
            "message": exc.message,
            "type": _ERROR_TYPES.get(exc.code, "server_error"),
            "param": getattr(exc, "param", None),
            "code": exc.code.value,
        }
    }


def new_id(prefix: str) -> str:
    """An id such as ``chatcmpl-…``: unique per answer, the same in all of a stream's chunks."""
    return f"{prefix}-{secrets.token_hex(12)}"


def now_s() -> int:
    """``created``: Unix seconds (wall time, as OpenAI's answers carry it)."""
    return int(time.time())


def model_list(names: list[str], created: int) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {"object": "list", "data": [model_card(n, created) for n in names]}


def model_card(name: str, created: int) -> dict[str, Any]:
    """One entry of ``/v1/models`` (and ``GET /v1/models/{model}``)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "modelyard"}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """``usage`` counts."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def embeddings_answer(
    model: str, vectors: np.ndarray, tokens: int, encoding: str
) -> dict[str, Any]:
    """``POST /v1/embeddings``: one ``embedding`` per row of ``vectors``.

    ``base64`` is the little-endian float32 bytes of each vector, as OpenAI sends them.
    """
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": (
                base64.b64encode(row.tobytes()).decode("ascii")
                if encoding == "base64"
                else row.tolist()
            ),
        }
        for i, row in enumerate(rows)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _envelope(
    answer_id: str,
    kind: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    counts: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The fields every completion answer and chunk shares, in OpenAI's order."""
    body: dict[str, Any] = {
        "id": answer_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if counts is not None:
        body["usage"] = counts
    return body


def _text_choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


def completion_answer(
    answer_id: str, created: int, model: str, text: str, finish: str | None, counts: dict[str, int]
) -> dict[str, Any]:
    """``POST /v1/completions`` without ``stream``."""
    return _envelope(
        answer_id, "text_completion", created, model, [_text_choice(text, finish)], counts
    )


def chat_answer(
    answer_id: str, created: int, model: str, text: str, finish: str | None, counts: dict[str, int]
) -> dict[str, Any]:
    """``POST /v1/chat/completions`` without ``stream``."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish,
    }
    return _envelope(answer_id, "chat.completion", created, model, [choice], counts)


def completion_chunk(
    answer_id: str, created: int, model: str, text: str, finish: str | None
) -> dict[str, Any]:
    """One server-sent event of a streamed ``/v1/completions``."""
    return _envelope(answer_id, "text_completion", created, model, [_text_choice(text, finish)])


def chat_chunk(
    answer_id: str, created: int, model: str, delta: dict[str, str], finish: str | None
) -> dict[str, Any]:
    """One server-sent event of a streamed ``/v1/chat/completions``."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _envelope(answer_id, "chat.completion.chunk", created, model, [choice])


def usage_chunk(
    answer_id: str, created: int, model: str, chat: bool, counts: dict[str, int]
) -> dict[str, Any]:
    """The last event when ``stream_options.include_usage``: no choices, the counts."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _envelope(answer_id, kind, created, model, [], counts)
