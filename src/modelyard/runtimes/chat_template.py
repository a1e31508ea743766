"""A generative model's chat template, compiled as llama-cpp-python compiles it."""

from __future__ import annotations

from typing import Any

from modelyard.errors import InvalidInputError


def compile_chat_template(raw: str) -> Any:
    """``raw`` (``tokenizer.chat_template``) compiled in jinja2's immutable sandbox, with
    ``trim_blocks`` and ``lstrip_blocks``; ``raise_exception`` in the template refuses the
    messages with InvalidInputError. jinja2 is imported here, in the worker only."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise InvalidInputError(f"the model's chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(raw)
