"""OpenAI-compatible request bodies: strict, bounded pydantic models, whatever transport.

``/v1/completions``, ``/v1/chat/completions``, ``/v1/embeddings``, ``/tokenize`` and
``/detokenize`` bodies are checked here before anything is routed. Every field the
OpenAI API defines is either honoured (``n``, ``logprobs``, penalties, ``logit_bias``,
``response_format``, ``tools``, ``echo``), accepted when its value changes nothing
(``best_of: 1``, ``user``), or refused with a 400 naming it (``suffix``, ``best_of: 2``,
``stream_options`` without ``stream``): a client never silently gets something other
than what it asked for. Unknown fields are refused too. Sizes are bounded (prompt
characters, messages, stop strings, ``max_tokens``, choices, tools, embedding inputs)
so that one body cannot make the server tokenise without end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

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
MAX_CHOICES = 16
"""``n``: choices of one request (each is a sequence of its own)."""
MAX_LOGIT_BIAS = 1024
MAX_TOOLS = 128
MAX_TOP_LOGPROBS = 20
"""vLLM's and OpenAI's limit; legacy completions' ``logprobs`` takes the same range."""
MAX_TOKENIZE_IDS = 1 << 17


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


class FunctionCall(BaseModel):
    """A tool call's function: its name and arguments (a JSON text, as OpenAI sends)."""

    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]


class ToolCallBody(BaseModel):
    """An assistant's earlier tool call, sent back in the conversation."""

    model_config = _STRICT
    id: Annotated[str, Field(max_length=256)]
    type: Literal["function"]
    function: FunctionCall


class ChatMessageBody(BaseModel):
    """One message of a chat: a role and its text (plain, or text parts)."""

    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    """``developer`` is OpenAI's newer name for ``system`` and is sent as such."""
    content: str | Annotated[list[Any], Field(max_length=MAX_MESSAGES)] | None = None
    """A string, or ``[{"type": "text", "text": ...}]`` parts (images are refused); None
    only in an assistant message that calls tools."""
    name: Annotated[str, Field(max_length=256)] | None = None
    tool_calls: Annotated[list[ToolCallBody], Field(max_length=MAX_TOOLS)] | None = None
    """An assistant's tool calls."""
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None
    """A ``tool`` message: the call it answers."""

    @field_validator("content")
    @classmethod
    def _text_parts(cls, content: str | list[Any] | None) -> str | list[Any] | None:
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

    @model_validator(mode="after")
    def _roles(self) -> ChatMessageBody:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("'content' is required (None only with an assistant's tool_calls)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has 'tool_calls'")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs 'tool_call_id'")
        return self

    def text(self) -> str:
        """The content as one string (text parts joined as OpenAI joins them)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(part["text"]) for part in self.content)

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template reads it: text content, and tool calls with
        their arguments as objects (as llama.cpp's server gives them to templates)."""
        role = "system" if self.role == "developer" else self.role
        doc: dict[str, Any] = {"role": role, "content": self.text()}
        if self.name is not None:
            doc["name"] = self.name
        if self.tool_call_id is not None:
            doc["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            doc["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _json_or_text(c)},
                }
                for c in self.tool_calls
            ]
        return doc


def _json_or_text(call: ToolCallBody) -> Any:
    try:
        return json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments


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
    """Only with ``stream: true`` (OpenAI, vLLM and Triton refuse it otherwise)."""
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    """Choices: each one is a sequence of its own (a given seed is ``seed + index``)."""
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: (
        Annotated[
            dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]],
            Field(max_length=MAX_LOGIT_BIAS),
        ]
        | None
    ) = None
    """Token id (as a string, as JSON keys are) to a bias added to its logit."""
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

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        for key in bias or {}:
            if not key.isdigit() or len(key) > 9:
                raise ValueError(f"the keys are token ids; {key[:32]!r} is not one")
        return bias

    @model_validator(mode="after")
    def _stream_options(self) -> _SamplingBody:
        if self.stream_options is not None and not self.stream:
            raise OpenAIRequestError(
                "'stream_options': only allowed with 'stream': true", "stream_options"
            )
        return self

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as ``(token id, bias)`` pairs."""
        return tuple((int(k), float(v)) for k, v in (self.logit_bias or {}).items())

    @property
    def choices(self) -> int:
        """``n`` (1 when not given)."""
        return self.n or 1

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
    echo: bool | None = None
    """Send the prompt back before the completion."""
    best_of: Literal[1] | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    """Each token's log probability and this many alternatives."""
    suffix: None = None

    @model_validator(mode="after")
    def _echo_logprobs(self) -> CompletionBody:
        if self.echo and self.logprobs is not None:
            raise OpenAIRequestError(
                "'echo' with 'logprobs' would need the prompt's log probabilities, which "
                "are not supported",
                "echo",
            )
        return self

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


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the answer must match."""

    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    """Required by OpenAI; optional here, as in llama.cpp's server (it names nothing)."""
    description: Annotated[str, Field(max_length=4096)] | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    """The JSON Schema (absent: any JSON value that is an object)."""
    strict: bool | None = None
    """Decoding is always constrained by the schema, strict or not."""


class ResponseFormat(BaseModel):
    """``response_format``: plain text, any JSON object, or JSON matching a schema. The
    JSON modes are grammar-constrained decoding: the answer parses, and matches."""

    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    """llama.cpp's server's extension: ``json_object`` with a schema."""

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("'json_schema' is given with, and only with, type 'json_schema'")
        if self.schema_ is not None and self.type != "json_object":
            raise ValueError("'schema' is given only with type 'json_object'")
        return self

    def schema_text(self) -> str | None:
        """The schema the answer must match, as JSON text; None for plain text."""
        if self.type == "text":
            return None
        schema = self.schema_ if self.json_schema is None else self.json_schema.schema_
        return json.dumps(schema if schema is not None else {"type": "object"})


class FunctionBody(BaseModel):
    """A tool's function: its name, what it does, its parameters' JSON Schema."""

    model_config = _STRICT
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, Field(max_length=4096)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolBody(BaseModel):
    """One tool a chat model may call (functions only, as in OpenAI's API)."""

    model_config = _STRICT
    type: Literal["function"]
    function: FunctionBody


class NamedFunction(BaseModel):
    """``{"name": ...}`` of a ``tool_choice`` that names the function to call."""

    model_config = _STRICT
    name: Annotated[str, Field(min_length=1, max_length=64)]


class NamedToolChoice(BaseModel):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``."""

    model_config = _STRICT
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionBody(_SamplingBody):
    """``POST /v1/chat/completions``: messages in, the assistant's reply out."""

    messages: Annotated[list[ChatMessageBody], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None = None
    """OpenAI's newer name for ``max_tokens``; giving both is refused."""
    logprobs: bool | None = None
    """Each generated token's log probability."""
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    """With ``logprobs``: this many alternatives per token."""
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ToolBody], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """``auto`` (the default with tools): the model may call one; ``required`` or a named
    function: it must, by a grammar built from the tools' parameter schemas."""
    parallel_tool_calls: bool | None = None
    """One call per answer is what a constrained call makes; the flag changes nothing."""

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionBody:
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIRequestError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        choice = self.tool_choice
        if choice is not None and choice != "none" and not self.tools:
            raise OpenAIRequestError("'tool_choice' needs 'tools'", "tool_choice")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in {
            t.function.name for t in self.tools or []
        }:
            raise OpenAIRequestError(
                f"'tool_choice': no tool is named {choice.function.name!r}", "tool_choice"
            )
        forced = choice == "required" or isinstance(choice, NamedToolChoice)
        if forced and self.response_format is not None and self.response_format.type != "text":
            raise OpenAIRequestError(
                "'response_format' cannot be combined with a required tool call (both "
                "constrain the answer)",
                "response_format",
            )
        return self

    @property
    def tool_mode(self) -> str:
        """``none`` (no tools), ``auto``, ``required`` or the name of the function to call."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "function:" + self.tool_choice.function.name
        return self.tool_choice or "auto"

    def top_logprobs_count(self) -> int | None:
        """The runtime's ``logprobs``: None (off) or the alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None

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

    def chat_context(self) -> str | None:
        """JSON of the full messages and tools for the chat template, when the chat has
        tools, tool calls or tool results (None: the plain pairs say everything)."""
        has_tools = self.tool_mode != "none"
        if not has_tools and not any(m.tool_calls or m.role == "tool" for m in self.messages):
            return None
        tools = [t.model_dump(exclude_none=True) for t in self.tools or []] if has_tools else []
        return json.dumps({"messages": [m.template_dict() for m in self.messages], "tools": tools})


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


class TokenizeBody(BaseModel):
    """``POST /tokenize`` (llama.cpp's server's shape, with ``model`` to pick one)."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """None: the server's only generative model (as llama.cpp's one-model server)."""
    content: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
    add_special: bool = False
    """Add the model's BOS token, as a prompt gets it."""
    with_pieces: bool = False
    """``tokens`` as ``{"id", "piece"}`` objects instead of ids."""


class DetokenizeBody(BaseModel):
    """``POST /detokenize``: token ids back to text."""

    model_config = _STRICT
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """None: the server's only generative model."""
    tokens: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=MAX_TOKENIZE_IDS)]


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
    "best_of": "only best_of: 1 (ask for several choices with 'n')",
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
