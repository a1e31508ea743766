"""A generative model's chat template, compiled as llama-cpp-python compiles it."""

from __future__ import annotations

import json
from typing import Any

from modelyard.errors import InvalidInputError
from modelyard.runtimes.generation import GenerationJob

TOOL_PROMPT = (
    "You may call one of these tools. To call one, answer only with "
    '<tool_call>{{"name": <the tool\'s name>, "arguments": <its arguments as a JSON object>}}'
    "</tool_call>.\nTools:\n{tools}"
)
"""Said to a model whose chat template does not render ``tools`` itself (the format
the answer parser reads: Hermes' ``<tool_call>`` blocks, which Qwen and others share)."""


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


def chat_messages(
    job: GenerationJob, template_source: str
) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """The messages and tools a chat template renders for ``job``.

    A plain chat is its ``(role, content)`` pairs. With ``chat_context`` (tools, tool
    calls, tool results) the full OpenAI messages and tools go to the template, which
    renders them in the model's own tool format; a template that has no ``tools`` gets
    them described in a system message instead (:data:`TOOL_PROMPT`).
    """
    assert job.messages is not None
    if job.chat_context is None:
        return [{"role": r, "content": c} for r, c in job.messages], None
    context = json.loads(job.chat_context)
    messages: list[dict[str, Any]] = list(context["messages"])
    tools = context.get("tools") or None
    if tools and "tools" not in template_source:
        messages = [_calls_as_text(m) for m in messages]
        note = TOOL_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if messages and messages[0].get("role") == "system":
            first = messages[0]
            messages[0] = {**first, "content": f"{first.get('content') or ''}\n\n{note}"}
        else:
            messages.insert(0, {"role": "system", "content": note})
        tools = None
    return messages, tools


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    # An assistant's earlier tool calls, written the way the model was told to call.
    calls = message.get("tool_calls")
    if not calls:
        return message
    blocks = "".join(
        "<tool_call>"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        + "</tool_call>"
        for c in calls
    )
    return {**message, "content": (message.get("content") or "") + blocks}
