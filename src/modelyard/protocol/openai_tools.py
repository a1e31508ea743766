"""Tool calling for the OpenAI chat API: the grammar's schema of a call, and reading calls.

A call the client requires (``tool_choice: "required"`` or a named function) is decoded
under a grammar built from the tools' own parameter schemas, so the answer is always one
well-formed call: ``{"name": <a tool's name>, "arguments": <matching its parameters>}``.
With ``auto`` the model writes freely, and an answer made of Hermes-style
``<tool_call>{...}</tool_call>`` blocks (the format Qwen's, Hermes' and modelyard's own
fallback prompt use), or of one bare call object, is read as tool calls; anything else
is the assistant's text.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from modelyard.protocol.openai import ToolBody

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def call_schema(tools: list[ToolBody], only: str | None) -> str:
    """The JSON Schema of one call to any of ``tools`` (or to ``only``), as JSON text."""
    options = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                "arguments": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
        if only is None or t.function.name == only
    ]
    return json.dumps(options[0] if len(options) == 1 else {"anyOf": options})


def read_calls(text: str, tools: list[ToolBody]) -> tuple[str | None, list[ToolCall]]:
    """``(content, calls)`` of an answer: its tool calls, and the text around them (None
    when nothing else was said). Blocks naming an unknown tool, or not JSON, stay text."""
    names = {t.function.name for t in tools}
    calls: list[ToolCall] = []
    rest = text
    for match in _BLOCK.finditer(text):
        call = _call(match.group(1), names)
        if call is not None:
            calls.append(call)
            rest = rest.replace(match.group(0), "", 1)
    if not calls:
        call = _call(text.strip(), names)
        if call is not None:
            return None, [call]
    rest = rest.strip()
    return (rest or None) if calls else text, calls


def _call(text: str, names: set[str]) -> ToolCall | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("name") not in names:
        return None
    arguments = doc.get("arguments", doc.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(f"call_{secrets.token_hex(12)}", str(doc["name"]), json.dumps(arguments))
