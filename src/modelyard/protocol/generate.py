"""Protocol-neutral text generation: the request, its sampling settings, the streamed chunks.

Every front end (``/predict`` with ``"text"``, the KServe v2 generate extension, the
OpenAI-compatible API) decodes its own wire form into a :class:`GenerateRequest` and
writes the :class:`GenerateChunk` objects that
:meth:`modelyard.frontends.dataplane.DataPlane.generate` yields back in its own form, so
sampling and stopping mean the same thing on every API.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISH_STOP = "stop"
"""The model produced its end-of-sequence token or a stop string matched."""
FINISH_LENGTH = "length"
"""``max_tokens`` were produced, or the context is full."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How the next token is chosen and when generation stops (the same on every API)."""

    max_tokens: int | None = None
    """Most tokens to generate; None: until the context is full. The server counts them
    itself (the runtime's own check is not relied on)."""
    temperature: float = 1.0
    """Softmax temperature; 0.0 means greedy (the most likely token, deterministic)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches this."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0: off."""
    seed: int | None = None
    """Seed of the sampler; None: a fresh one per request."""
    stop: tuple[str, ...] = ()
    """Generation stops before the first occurrence of any of these strings; the stop
    string itself is not returned."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat: ``role`` (``system``, ``user``, ``assistant``) and text."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """A decoded generation request, whichever API it came on.

    Exactly one of ``prompt`` and ``messages`` is set; ``messages`` are rendered with the
    chat template stored in the model's own metadata.
    """

    model: str
    version: str | None
    prompt: str | None
    messages: tuple[ChatMessage, ...] | None
    sampling: SamplingParams
    priority: int | None = None
    """1 is the highest; None means the model's own priority."""
    timeout_s: float | None = None
    """The client's own deadline budget for the whole generation (may only shorten the
    model's ``timeout_s``)."""


@dataclass(frozen=True, slots=True)
class GenerateChunk:
    """One piece of generated text; the last chunk of a stream has ``finish_reason``.

    ``prompt_tokens`` and ``completion_tokens`` are running totals (final on the last
    chunk), so a front end can report ``usage`` from the last chunk alone.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    """``"stop"`` | ``"length"`` on the last chunk; None while streaming."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
