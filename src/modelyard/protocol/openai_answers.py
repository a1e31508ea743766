"""OpenAI-compatible answers: response bodies, stream chunks and the error object.

Plain dictionaries, built the way OpenAI's API spells them, so that the stock
``openai`` client parses them unchanged. Nothing here knows about HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelyard import __version__
from modelyard.errors import ErrorCode, ServerError
from modelyard.protocol.generate import TokenLogprob

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


def system_fingerprint(model: str, version: str) -> str:
    """``system_fingerprint``: names the server release and the model version that
    answered, so a client sees when either changed (the same for the same pair)."""
    digest = hashlib.sha256(f"modelyard {__version__} {model}:{version}".encode()).hexdigest()
    return f"fp_{digest[:12]}"


def _envelope(
    answer_id: str,
    kind: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    counts: dict[str, int] | None = None,
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """The fields every completion answer and chunk shares, in OpenAI's order."""
    body: dict[str, Any] = {
        "id": answer_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if fingerprint is not None:
        body["system_fingerprint"] = fingerprint
    if counts is not None:
        body["usage"] = counts
    return body


def _token_text(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``: per token its text, bytes, logprob, alternatives."""
    return {
        "content": [
            {
                "token": _token_text(e.piece),
                "logprob": e.logprob,
                "bytes": list(e.piece),
                "top_logprobs": [
                    {"token": _token_text(piece), "logprob": lp, "bytes": list(piece)}
                    for _, piece, lp in e.top
                ],
            }
            for e in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """A completion choice's ``logprobs`` (the legacy shape): tokens, their logprobs, the
    alternatives as ``{token: logprob}``, and each token's character offset in the text
    (counting from ``offset``)."""
    offsets: list[int] = []
    for e in entries:
        offsets.append(offset)
        offset += len(_token_text(e.piece))
    return {
        "tokens": [_token_text(e.piece) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_token_text(p): lp for _, p, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def text_choice(
    index: int, text: str, finish: str | None, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One choice of ``/v1/completions`` (or of one of its stream events)."""
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}


def chat_choice(
    index: int,
    message: dict[str, Any],
    finish: str | None,
    logprobs: dict[str, Any] | None = None,
    *,
    delta: bool = False,
) -> dict[str, Any]:
    """One choice of ``/v1/chat/completions``: a ``message``, or a stream's ``delta``."""
    return {
        "index": index,
        "delta" if delta else "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
    }


def assistant_message(content: str | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant's message: its text (None when it only calls tools) and calls."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return message


def completion_answer(
    answer_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    counts: dict[str, int],
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """``POST /v1/completions`` without ``stream``."""
    return _envelope(answer_id, "text_completion", created, model, choices, counts, fingerprint)


def chat_answer(
    answer_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    counts: dict[str, int],
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """``POST /v1/chat/completions`` without ``stream``."""
    return _envelope(answer_id, "chat.completion", created, model, choices, counts, fingerprint)


def stream_event(
    answer_id: str,
    created: int,
    model: str,
    chat: bool,
    choice: dict[str, Any],
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """One server-sent event of a streamed completion: one choice's piece."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _envelope(answer_id, kind, created, model, [choice], None, fingerprint)


def usage_chunk(
    answer_id: str, created: int, model: str, chat: bool, counts: dict[str, int]
) -> dict[str, Any]:
    """The last event when ``stream_options.include_usage``: no choices, the counts."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _envelope(answer_id, kind, created, model, [], counts)


def tokenize_answer(ids: Sequence[int], pieces: Sequence[TokenLogprob] | None) -> dict[str, Any]:
    """``POST /tokenize``: ``{"tokens": [ids]}``, or ``[{"id", "piece"}]`` with pieces
    (a piece that is not valid UTF-8 alone is its list of bytes, as llama.cpp sends it)."""
    if pieces is None:
        return {"tokens": list(ids)}
    out: list[dict[str, Any]] = []
    for p in pieces:
        try:
            piece: str | list[int] = p.piece.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(p.piece)
        out.append({"id": p.token_id, "piece": piece})
    return {"tokens": out}
