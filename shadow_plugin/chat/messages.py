"""Message clean-up a vLLM + transformers server applies before its chat template runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _decode_arguments(args: Any) -> dict:
    """vLLM's rule: falsy -> {}; JSON text -> decoded; anything not an object -> {}."""
    if not args:
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return {}
    return args if isinstance(args, Mapping) else {}


def _normalize_tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    call = dict(call)
    if isinstance(call.get("function"), Mapping):
        call["function"] = {**call["function"],
                            "arguments": _decode_arguments(call["function"].get("arguments"))}
    elif "function" not in call:
        call["arguments"] = _decode_arguments(call.get("arguments"))
    return call


def _normalize_message(message: Any) -> Any:
    if not isinstance(message, Mapping):
        return message
    out = {k: v for k, v in message.items() if v is not None}
    if "reasoning_content" not in out:
        alias = out.get("thinking", out.get("reasoning"))
        if alias is not None:
            out["reasoning_content"] = alias
    calls = out.get("tool_calls")
    if out.get("role") == "assistant" and isinstance(calls, (list, tuple)):
        if calls:
            out["tool_calls"] = [_normalize_tool_call(c) for c in calls]
        else:
            del out["tool_calls"]
    return out


def normalize_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Clean messages the way a vLLM + transformers server does before its template runs.

    - top-level keys whose value is ``None`` are dropped (transformers);
    - ``reasoning_content`` is filled from ``thinking`` / ``reasoning`` when absent
      (transformers' reasoning aliases; vLLM's ``reasoning`` field);
    - assistant ``tool_calls``: an empty list is dropped; each call's ``arguments`` is
      decoded from a JSON string, and empty/``None``/undecodable/non-object arguments
      become ``{}`` (vLLM ``_postprocess_messages``).

    Args:
        messages: OpenAI-style message dicts. Not modified.
    Returns:
        A new list of new dicts (nested tool-call dicts copied where changed).
    Raises:
        Nothing; items that are not mappings are passed through unchanged.
    """
    return [_normalize_message(m) for m in messages]
