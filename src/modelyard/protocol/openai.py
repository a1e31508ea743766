"""OpenAI-compatible request bodies: strict, bounded pydantic models, whatever transport.

``/v1/completions``, ``/v1/chat/completions`` and ``/v1/embeddings`` bodies are checked
here before anything is routed. Every field the OpenAI API defines is either honoured,
accepted when its value changes nothing (``n: 1``, ``echo: false``, ``user``), or
refused with a 400 naming it (``n: 2``, ``logprobs``, ``tools``, penalties): a client
never silently gets something other than what it asked for. Unknown fields are refused
too. Sizes are bounded (prompt characters, messages, stop strings, ``max_tokens``,
embedding inputs) so that one body cannot make the server tokenise without end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from modelyard.errors import InvalidInputError
from modelyard.protocol.generate import MAX_PROMPT_CHARS

MAX_EMBEDDING_CHARS = 1 << 20
"""Characters of all of one embeddings request's texts together."""
MAX_MESSAGES = 1024
"""Messages in one chat request."""
MAX_STOP = 4
"""Stop strings in one request (OpenAI's own limit)."""
MAX_STOP_CHARS = 256
"""Characters of one stop string."""
MAX_TOKENS = 1 << 17
"""The largest ``max_tokens`` accepted at all; the model's context bounds it further."""
MAX_EMBEDDING_INPUTS = 2048
"""Texts in one embeddings request (OpenAI's own limit)."""
MAX_SEED = (1 << 32) - 1
"""Seeds are 32-bit in llama.cpp; a larger one is refused, never truncated."""


_Body = TypeVar("_Body", bound=BaseModel)


class OpenAIRequestError(InvalidInputError):
    """A request body the OpenAI routes refuse; ``param`` names the field (or None)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` exists."""

    model_config = _STRICT
    include_usage: bool = False
    """Send one last chunk with the ``usage`` counts (and no choices) before ``[DONE]``."""


class ChatMessageBody(BaseModel):
    """One message of a chat: a role and its text (plain, or text parts)."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    """``developer`` is OpenAI's newer name for ``system`` and is sent as such."""
    content: str | Annotated[list[Any], Field(max_length=MAX_MESSAGES)]
    """A string, or ``[{"type": "text", "text": ...}]`` parts (images are refused)."""

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content: str | list[Any]) -> str | list[Any]:
        if isinstance(content, list):
            for part in content:
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                    and len(part) == 2
                ):
                    raise ValueError(
                        'only text content is supported: a string or {"type": "text", '
                        '"text": "..."} parts'
                    )
        return content

    def text(self) -> str:
        """The content as one string (text parts joined as OpenAI joins them)."""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part["text"]) for part in self.content)


StopField = Annotated[
    str | list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] | None,
    Field(default=None),
]


class _SamplingBody(BaseModel):
    """Fields ``/v1/completions`` and ``/v1/chat/completions`` share."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, max_length=256)]
    """A model name, optionally ``name:version``."""
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=1 << 20)] | None = None
    """Not in OpenAI's API; llama.cpp's and vLLM's servers take it too (0: off)."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StopField
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = None
    """Only one choice per request: several would silently multiply the cost."""
    frequency_penalty: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    """Accepted and ignored: it changes nothing in the answer."""
    priority: Annotated[int, Field(ge=1)] | None = None
    """modelyard's schedule policy (1 is the highest), as on every other route."""

    @field_validator("stop")
    @classmethod
    def _bounded_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, str) and not 1 <= len(stop) <= MAX_STOP_CHARS:
            raise ValueError(f"a stop string has 1 to {MAX_STOP_CHARS} characters")
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return stop

    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings as a tuple (empty when none)."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a ``usage`` chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(_SamplingBody):
    """``POST /v1/completions``: one prompt in, one completion out."""

    prompt: str | list[Any]
    """One prompt (a list holding exactly one string is accepted too)."""
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None
    logprobs: None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _bounded_prompt(cls, prompt: str | list[Any]) -> str | list[Any]:
        if isinstance(prompt, list) and not (len(prompt) == 1 and isinstance(prompt[0], str)):
            raise ValueError(
                "one text prompt per request: a string, or a list holding one string "
                "(token-id prompts and batches of prompts are not supported)"
            )
        text = prompt if isinstance(prompt, str) else prompt[0]
        if len(text) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt has more than {MAX_PROMPT_CHARS} characters")
        return prompt

    def prompt_text(self) -> str:
        """The one prompt."""
        return self.prompt if isinstance(self.prompt, str) else str(self.prompt[0])


class ResponseFormat(BaseModel):
    """``response_format``: only plain text (JSON modes would need constrained decoding)."""

    model_config = _STRICT
    type: Literal["text"]


class ChatCompletionBody(_SamplingBody):
    """``POST /v1/chat/completions``: messages in, the assistant's reply out."""

    messages: Annotated[list[ChatMessageBody], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    """OpenAI's newer name for ``max_tokens``; giving both is refused."""
    logprobs: Literal[False] | None = None
    top_logprobs: None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Any], Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None
    """Harmless without tools."""

    @field_validator("messages")
    @classmethod
    def _bounded_messages(cls, messages: list[ChatMessageBody]) -> list[ChatMessageBody]:
        if sum(len(m.text()) for m in messages) > MAX_PROMPT_CHARS:
            raise ValueError(f"the messages have more than {MAX_PROMPT_CHARS} characters")
        return messages

    def completion_limit(self) -> int | None:
        """``max_completion_tokens`` or ``max_tokens`` (None: up to the context)."""
        if self.max_completion_tokens is not None and self.max_tokens is not None:
            raise OpenAIRequestError(
                "give 'max_tokens' or 'max_completion_tokens', not both", "max_tokens"
            )
        return self.max_completion_tokens or self.max_tokens

    def chat_messages(self) -> list[tuple[str, str]]:
        """``(role, text)`` per message, ``developer`` sent as ``system``."""
        return [("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]


class EmbeddingBody(BaseModel):
    """``POST /v1/embeddings``: texts in, one vector per text out."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, max_length=256)]
    input: str | Annotated[list[Any], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    """One text or a list of texts (token-id arrays are refused: encoders take text)."""
    encoding_format: Literal["float", "base64"] = "float"
    """``base64``: little-endian float32 bytes, what the ``openai`` client asks for."""
    dimensions: Annotated[int, Field(ge=1)] | None = None
    """Must be the model's own width when given (vectors are never cut)."""
    user: Annotated[str, Field(max_length=256)] | None = None
    priority: Annotated[int, Field(ge=1)] | None = None

    @field_validator("input")
    @classmethod
    def _bounded_input(cls, value: str | list[Any]) -> str | list[Any]:
        texts = [value] if isinstance(value, str) else value
        if not all(isinstance(t, str) for t in texts):
            raise ValueError("a string or a list of strings (token-id inputs are not supported)")
        if sum(len(t) for t in texts) > MAX_EMBEDDING_CHARS:
            raise ValueError(f"the inputs have more than {MAX_EMBEDDING_CHARS} characters")
        return value

    def texts(self) -> list[str]:
        """The inputs as a list."""
        return [self.input] if isinstance(self.input, str) else [str(t) for t in self.input]


def parse_body(kind: type[_Body], doc: Mapping[str, Any]) -> _Body:
    """``doc`` as ``kind``, or :class:`OpenAIRequestError` naming the first bad field."""
    try:
        return kind.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        # A union reports one branch per error; keep the field path, not the branch names.
        path = [p for p in loc if not _is_branch(p)]
        param = path[0] if path else None
        where = ".".join(path) or "body"
        if first["type"] == "extra_forbidden":
            message = f"unsupported field {where!r}: modelyard does not implement it"
        elif path and path[0] in _REFUSED:
            message = f"{where!r}: {_REFUSED[path[0]]}"
        else:
            message = f"{where}: {first['msg'].removeprefix('Value error, ')}"
        raise OpenAIRequestError(message, param) from None


_REFUSED = {
    "n": "only one choice per request (n: 1)",
    "best_of": "only best_of: 1",
    "echo": "echo is not supported",
    "logprobs": "log probabilities are not supported",
    "top_logprobs": "log probabilities are not supported",
    "frequency_penalty": "penalties are not supported (0 only)",
    "presence_penalty": "penalties are not supported (0 only)",
    "logit_bias": "logit_bias is not supported",
    "tools": "tools and function calling are not supported",
    "tool_choice": "tools and function calling are not supported",
    "suffix": "suffix (insertion) is not supported",
}


def _is_branch(part: str) -> bool:
    # pydantic names union branches like "str", "list[str]", "literal[...]", "function-after[...]".
    return part in ("str", "int", "float", "bool", "none") or "[" in part or "-" in part


def split_model(model: str) -> tuple[str, str | None]:
    """``name`` or ``name:version`` (names never hold a colon) as ``(name, version)``."""
    name, sep, version = model.partition(":")
    if sep and not version:
        raise OpenAIRequestError("'model': the version after ':' is empty", "model")
    return name, (version if sep else None)
