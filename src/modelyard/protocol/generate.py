"""Protocol-neutral text generation: the request, its sampling settings, the streamed chunks.

Every front end (``/predict`` with ``"text"``, the KServe v2 generate extension, the
OpenAI-compatible API) decodes its own wire form into a :class:`GenerateRequest` and
writes the :class:`GenerateChunk` objects that
:meth:`modelyard.frontends.dataplane.DataPlane.generate` yields back in its own form, so
sampling and stopping mean the same thing on every API.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelyard.errors import InvalidInputError

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
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated already (-2 to 2)."""
    presence_penalty: float = 0.0
    """Subtracted from a token's logit once if it was generated already (-2 to 2)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """``(token id, bias)`` pairs added to the logits before sampling (-100 to 100)."""
    json_schema: str | None = None
    """A JSON Schema (as JSON text) the output must match: decoding is constrained by a
    grammar built from it. ``{"type": "object"}`` is any JSON object."""
    logprobs: int | None = None
    """None: no log probabilities; k >= 0: each generated token's log probability and
    the k most likely alternatives at its position."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat: ``role`` (``system``, ``user``, ``assistant``, ``tool``)
    and text."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token with its log probability (natural log, <= 0) and the most
    likely alternatives at its position, as ``(token id, bytes, logprob)``."""

    token_id: int
    piece: bytes
    """The token's bytes (a token may hold part of a UTF-8 character)."""
    logprob: float
    top: tuple[tuple[int, bytes, float], ...] = ()


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
    resume_token_ids: tuple[int, ...] = ()
    """Set by the server only, never from a request: the tokens a preempted stream had
    produced, from which its sequence resumes (see ``scheduling/generation_gate.py``)."""
    chat_context: str | None = None
    """JSON ``{"messages": [...], "tools": [...]}``: the full OpenAI messages (tool calls,
    tool results) and tool definitions, for a chat template that renders tools; None
    for a plain chat (``messages`` then says everything)."""
    task: str = "generate"
    """``generate``; ``tokenize`` (``prompt`` to token ids, with BOS when
    ``add_special``) or ``detokenize`` (``token_ids`` to text): answered at once by the
    model's runtime, in one chunk."""
    token_ids: tuple[int, ...] = ()
    """The input of ``detokenize``."""
    add_special: bool = False


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
    model_version: str = ""
    """The version that generated it (set by the data plane; an alias resolves to one)."""
    max_tokens_capped_to: int | None = None
    """Set (on every chunk) when brownout capped the request's ``max_tokens`` at this value
    because the model was overloaded; None: the request ran as asked."""
    logprobs: tuple[TokenLogprob, ...] = ()
    """With ``SamplingParams.logprobs``: one entry per token generated since the last
    chunk (the pieces of a tokenize answer, with logprob 0)."""


BROWNOUT_KEY = "max_tokens_capped_to"
"""Answer key (and SSE event key) present when brownout capped the request's
``max_tokens``: the cap it ran under."""
BROWNOUT_HEADER = "X-Modelyard-Brownout"
"""HTTP response header of a brownout answer: ``max_tokens=<cap>``."""


def brownout_header(capped_to: int) -> str:
    """The value of :data:`BROWNOUT_HEADER` for an answer capped at ``capped_to`` tokens."""
    return f"max_tokens={capped_to}"


@dataclass(frozen=True, slots=True)
class GenerationTarget:
    """The model version a generation request resolved to, as the front ends see it."""

    name: str
    version: str
    """A concrete version (an alias or the default resolved once, here)."""
    runtime: str
    generative: bool
    context_length: int | None
    """Tokens per sequence (the worker's figure once loaded, else the file's header)."""


def check_max_tokens(request: GenerateRequest, n_ctx: int | None, model: str) -> None:
    """Refuse a ``max_tokens`` that alone fills the context of ``n_ctx`` tokens per
    sequence (the worker checks prompt + ``max_tokens`` once the prompt is tokenized;
    this one is refused before any queueing)."""
    wanted = request.sampling.max_tokens
    if n_ctx is not None and wanted is not None and wanted >= n_ctx:
        raise InvalidInputError(
            f"max_tokens {wanted} + a prompt of at least 1 token > the context of "
            f"{n_ctx} tokens per sequence of model {model!r}: ask for at most "
            f"{n_ctx - 1} new tokens"
        )


MAX_PROMPT_CHARS = 128 * 1024
"""Longest prompt (or all messages together) one request may send, in characters."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def check_generate_request(request: GenerateRequest) -> None:
    """InvalidInputError unless ``request`` is well formed (the same words on every API)."""
    if (request.prompt is None) == (request.messages is None):
        raise InvalidInputError("give exactly one of a prompt and chat messages")
    if request.messages is not None:
        if not request.messages:
            raise InvalidInputError("'messages' must hold at least one message")
        for i, m in enumerate(request.messages):
            if not isinstance(m.role, str) or not m.role:
                raise InvalidInputError(f"message {i} has no role")
            if not isinstance(m.content, str):
                raise InvalidInputError(f"message {i}: 'content' must be a string")
        size = sum(len(m.content) + len(m.role) for m in request.messages)
    else:
        assert request.prompt is not None
        if not isinstance(request.prompt, str):
            raise InvalidInputError("the prompt must be a string")
        size = len(request.prompt)
    if size > MAX_PROMPT_CHARS:
        raise InvalidInputError(
            f"the prompt is {size} characters; at most {MAX_PROMPT_CHARS} are accepted"
        )
    check_sampling(request.sampling)


MAX_LOGIT_BIAS = 1024
"""Entries of one ``logit_bias``."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per token (OpenAI's own limit)."""
MAX_SCHEMA_CHARS = 64 * 1024
"""Characters of a ``json_schema`` (its grammar is built per request)."""


def check_sampling(s: SamplingParams) -> None:
    """InvalidInputError unless every sampling parameter is in range."""
    if s.max_tokens is not None and (
        isinstance(s.max_tokens, bool) or not isinstance(s.max_tokens, int) or s.max_tokens < 1
    ):
        raise InvalidInputError("'max_tokens' must be a positive integer")
    if not _number(s.temperature) or s.temperature < 0:
        raise InvalidInputError("'temperature' must be a number >= 0 (0 is greedy)")
    if not _number(s.top_p) or not 0 < s.top_p <= 1:
        raise InvalidInputError("'top_p' must be a number in (0, 1]")
    if isinstance(s.top_k, bool) or not isinstance(s.top_k, int) or s.top_k < 0:
        raise InvalidInputError("'top_k' must be an integer >= 0 (0 is off)")
    if s.seed is not None and (isinstance(s.seed, bool) or not isinstance(s.seed, int)):
        raise InvalidInputError("'seed' must be an integer")
    if len(s.stop) > MAX_STOP_STRINGS:
        raise InvalidInputError(f"at most {MAX_STOP_STRINGS} stop strings are accepted")
    for stop in s.stop:
        if not isinstance(stop, str) or not stop or len(stop) > MAX_STOP_CHARS:
            raise InvalidInputError(
                f"each stop string must be a non-empty string of at most {MAX_STOP_CHARS} "
                "characters"
            )
    for name, penalty in (("frequency", s.frequency_penalty), ("presence", s.presence_penalty)):
        if not _number(penalty) or not -2.0 <= penalty <= 2.0:
            raise InvalidInputError(f"'{name}_penalty' must be a number in [-2, 2]")
    if len(s.logit_bias) > MAX_LOGIT_BIAS or not all(
        isinstance(t, int) and t >= 0 and _number(b) and -100 <= b <= 100 for t, b in s.logit_bias
    ):
        raise InvalidInputError(
            f"'logit_bias' maps at most {MAX_LOGIT_BIAS} token ids (>= 0) to numbers in [-100, 100]"
        )
    if s.json_schema is not None and len(s.json_schema) > MAX_SCHEMA_CHARS:
        raise InvalidInputError(f"the JSON schema has more than {MAX_SCHEMA_CHARS} characters")
    if s.logprobs is not None and not 0 <= s.logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidInputError(f"'logprobs' asks for 0 to {MAX_TOP_LOGPROBS} alternatives")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


SAMPLING_KEYS = frozenset(
    {"max_tokens", "temperature", "top_p", "top_k", "seed", "random_seed", "stop", "stop_words"}
)
"""The sampling parameters the KServe generate extension and ``/predict`` read."""


def sampling_from_params(params: Mapping[str, Any]) -> SamplingParams:
    """:class:`SamplingParams` from a generate request's ``parameters`` (Triton's names
    too: ``random_seed``, ``stop_words``); InvalidInputError for a value of the wrong type.
    Unknown keys are left to the caller (``stream``, ``priority``, ``timeout``)."""
    stop = params.get("stop", params.get("stop_words"))
    if stop is None or stop == "":
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        stops = tuple(stop)
    else:
        raise InvalidInputError("'stop' must be a string or a list of strings")
    seed = params.get("seed", params.get("random_seed"))
    sampling = SamplingParams(
        max_tokens=params.get("max_tokens"),
        temperature=params.get("temperature", 1.0),
        top_p=params.get("top_p", 1.0),
        top_k=params.get("top_k", 0),
        seed=seed,
        stop=stops,
    )
    check_sampling(sampling)
    return sampling
