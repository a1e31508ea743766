"""The contract of a generative runtime, the side that runs inside a worker.

A generative runtime loads its model, then takes :class:`GenerationJob` objects and
reports what it produces through a :class:`GenerationSink` from its own generation
thread, as the tokens come: a worker forwards each report to the server at once. Jobs
are identified by the ``seq`` the server chose, which is also how the server cancels one
(the client went away, or its deadline passed).

The same meaning of sampling and stopping on every runtime: greedy when ``temperature``
is 0; else top-k (0: off), top-p (1: off), temperature, then a draw seeded by ``seed``;
``max_tokens`` counted here, never left to the library; stop strings cut by
:class:`~modelyard.runtimes.textstream.TextStream`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from modelyard.errors import InvalidInputError
from modelyard.protocol.generate import TokenLogprob
from modelyard.runtimes.base import RuntimeSpec


@dataclass(frozen=True, slots=True)
class GenerationJob:
    """One request to generate, as plain data (it crossed a process boundary)."""

    seq: int
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None
    """``(role, content)`` pairs, rendered with the model's chat template."""
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    resume_ids: tuple[int, ...] = ()
    """Tokens this request generated before it was preempted: evaluated after the prompt,
    counted as generated, never sent again; generation continues after them."""
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    json_schema: str | None = None
    """Constrain the output to this JSON Schema (a runtime without grammars refuses it)."""
    logprobs: int | None = None
    """Report each token's log probability and this many alternatives (None: off)."""
    chat_context: str | None = None
    """JSON of the full OpenAI messages and tools, for a template that renders tools."""
    task: str = "generate"
    """``generate``, ``tokenize`` or ``detokenize`` (answered at once, in one chunk)."""
    token_ids: tuple[int, ...] = ()
    add_special: bool = False

    def extras(self) -> list[str]:
        """The fields this job sets beyond plain sampling, by their OpenAI names (for a
        runtime that honours none of them and must refuse rather than ignore them)."""
        named = {
            "frequency_penalty": self.frequency_penalty != 0.0,
            "presence_penalty": self.presence_penalty != 0.0,
            "logit_bias": bool(self.logit_bias),
            "response_format": self.json_schema is not None,
            "logprobs": self.logprobs is not None,
            "tools": self.chat_context is not None,
            "tokenize": self.task != "generate",
        }
        return [name for name, used in named.items() if used]


@dataclass(frozen=True, slots=True)
class GenerationStats:
    """Counters a generative runtime keeps; the worker reports them on request."""

    generated_tokens: int
    """Tokens sampled since the model loaded (every job, cancelled ones included)."""
    prompt_tokens: int
    active: int
    """Jobs being generated now."""
    kv_cache_bytes: int
    context_length: int
    parallel: int
    reused_prompt_tokens: int = 0
    """Prompt tokens found in the KV cache (a prefix already evaluated), not evaluated
    again; counted in ``prompt_tokens`` too."""


class GenerationSink(Protocol):
    """Where a generative runtime reports, from its generation thread."""

    def chunk(
        self,
        seq: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> None:
        """Text produced for job ``seq``; the last report has ``finish_reason``;
        ``logprobs`` one entry per token when the job asked for them."""
        ...

    def failed(self, seq: int, code: str, message: str) -> None:
        """Job ``seq`` failed (``code`` an :class:`~modelyard.errors.ErrorCode` value)."""
        ...


class GenerativeRuntime(Protocol):
    """What a generative runtime implements (``llama_cpp``, ``transformers``)."""

    @property
    def context_length(self) -> int:
        """Tokens one sequence may hold, prompt and generated together."""
        ...

    def load(self, spec: RuntimeSpec) -> None:
        """Load the model; raise on any failure."""
        ...

    def warm_up(self) -> None:
        """Run what a first request would allocate (compute buffers), so that a
        footprint measured before any request includes it; raise on failure."""
        ...

    def start(self, sink: GenerationSink) -> None:
        """Start the generation thread; it reports to ``sink``."""
        ...

    def submit(self, job: GenerationJob) -> None:
        """Queue a job; its outcome arrives through the sink."""
        ...

    def cancel(self, seq: int) -> None:
        """Stop job ``seq`` (queued or running); nothing more is reported for it."""
        ...

    def stats(self) -> GenerationStats:
        """The runtime's counters now."""
        ...

    def close(self) -> None:
        """Stop the thread and free the model."""
        ...


def int_option(spec: RuntimeSpec, name: str, default: int) -> int:
    """An integer model setting from ``spec.options`` (the ``generation:`` block)."""
    value = spec.options.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {value!r}") from None


def bool_option(spec: RuntimeSpec, name: str, default: bool) -> bool:
    """A yes/no model setting from ``spec.options`` (``True``/``False``, ``1``/``0``)."""
    value = spec.options.get(name)
    if value is None or value == "":
        return default
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r} must be true or false, not {value!r}")


def check_context(prompt_tokens: int, max_tokens: int | None, context_length: int) -> None:
    """InvalidInputError, with the arithmetic, when the request cannot fit the context."""
    if prompt_tokens >= context_length:
        raise InvalidInputError(
            f"the prompt is {prompt_tokens} tokens; the model's context holds "
            f"{context_length} tokens per sequence, so at most {context_length - 1} "
            "prompt tokens leave room for one generated token"
        )
    if max_tokens is not None and prompt_tokens + max_tokens > context_length:
        raise InvalidInputError(
            f"prompt {prompt_tokens} tokens + max_tokens {max_tokens} = "
            f"{prompt_tokens + max_tokens} tokens, more than the context of "
            f"{context_length} tokens per sequence: ask for at most "
            f"{context_length - prompt_tokens} new tokens"
        )
