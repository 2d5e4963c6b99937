"""Qwen3.5 / Qwen3.6 chat rendering (docs/specs/qwen35-chat-format.md).

``render`` produces, byte for byte, what transformers renders from the official chat
templates, after the message clean-up a vLLM + transformers server applies
(``normalize_messages``). ``render_with_template`` renders a model directory's own Jinja
template the way transformers does; ``shadow_plugin.chat.renderer.Renderer`` picks between the two.
Tokenizer loading and the special-token ids live in ``shadow_plugin.chat.tokenizer`` and are
re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from shadow_plugin.chat.messages import normalize_messages
from shadow_plugin.chat.templates import render_with_template
from shadow_plugin.chat.tokenizer import (
    CHAT_TOKENS,
    SPECIAL_TOKENS,
    ChatTemplateError,
    ChatTokens,
    load_tokenizer,
)

__all__ = [
    "CHAT_TOKENS", "SPECIAL_TOKENS", "TEMPLATES", "ChatTemplateError", "ChatTokens",
    "TemplateSpec", "load_tokenizer", "normalize_messages", "render", "render_with_template",
]

TOOLS_HEAD = "# Tools\n\nYou have access to the following functions:\n\n<tools>"
TOOLS_INSTR = (
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
    "Reminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>"
)
THINK_OPEN = "<think>\n"
THINK_EMPTY = "<think>\n\n</think>\n\n"
IMAGE_PAD = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PAD = "<|vision_start|><|video_pad|><|vision_end|>"


@dataclass(frozen=True)
class TemplateSpec:
    """How one official template differs from the Qwen3.5-27B one.

    Attributes:
        name: template name, e.g. ``"qwen3.5-27b"``.
        thinking_default: generation prompt opens a think block unless told otherwise
            (big sizes: ``enable_thinking is not False``; small: ``enable_thinking is True``).
        qwen36: Qwen3.6 rules (``preserve_thinking``; ``tojson`` for every non-string
            tool-call argument).
    """

    name: str
    thinking_default: bool = True
    qwen36: bool = False


_BIG, _SMALL, _Q36 = (TemplateSpec("qwen3.5-27b"), TemplateSpec("qwen3.5-0.8b", False),
                      TemplateSpec("qwen3.6-27b", qwen36=True))
#: Built-in templates by (lower-case) model name.
TEMPLATES: Mapping[str, TemplateSpec] = MappingProxyType({
    **{f"qwen3.5-{s}": _BIG for s in ("4b", "9b", "27b", "35b-a3b", "122b-a10b", "397b-a17b")},
    **{f"qwen3.5-{s}": _SMALL for s in ("0.8b", "2b")},
    **{f"qwen3.6-{s}": _Q36 for s in ("27b", "35b-a3b")},
})


def template_spec(template: str | TemplateSpec) -> TemplateSpec:
    """The TemplateSpec of a TEMPLATES name (a path's last part, any case), or `template`
    itself. Raises ValueError naming the known names for an unknown one."""
    if isinstance(template, TemplateSpec):
        return template
    spec = TEMPLATES.get(template.rsplit("/", 1)[-1].lower())
    if spec is None:
        raise ValueError(f"unknown chat template {template!r}; known: {sorted(TEMPLATES)}")
    return spec


# ---------------------------------------------------------------- built-in renderer


@dataclass
class _Vision:
    """Per-render image/video counters (for ``add_vision_id``)."""

    add_id: bool
    images: int = 0
    videos: int = 0


def _part_text(item: Any, vision: _Vision, count: bool, system: bool) -> str:
    """One content part, following the template's membership tests."""
    if not isinstance(item, (Mapping, str)):
        raise ChatTemplateError("Unexpected item type in content.")
    kind = item.get("type") if isinstance(item, Mapping) else None
    if "image" in item or "image_url" in item or kind == "image":
        if system:
            raise ChatTemplateError("System message cannot contain images.")
        vision.images += int(count)
        return (f"Picture {vision.images}: " if vision.add_id else "") + IMAGE_PAD
    if "video" in item or kind == "video":
        if system:
            raise ChatTemplateError("System message cannot contain videos.")
        vision.videos += int(count)
        return (f"Video {vision.videos}: " if vision.add_id else "") + VIDEO_PAD
    if "text" in item:
        text = item["text"] if isinstance(item, Mapping) else ""
        return text if isinstance(text, str) else str(text)
    raise ChatTemplateError("Unexpected item type in content.")


def _text(message: Mapping, vision: _Vision, count: bool = True, system: bool = False) -> str:
    """``render_content(...) | trim`` of the template (spec section 4)."""
    content = message.get("content")
    if isinstance(content, str):
        return content.strip()
    if content is None:
        return ""
    if isinstance(content, (list, tuple)):
        return "".join(_part_text(p, vision, count, system) for p in content).strip()
    raise ChatTemplateError("Unexpected content type.")


def _system_turn(messages: list, tools: Any, vision: _Vision) -> str:
    first = messages[0]
    has_sys = isinstance(first, Mapping) and first.get("role") == "system"
    sys_text = _text(first, vision, count=False, system=True) if has_sys else ""
    if isinstance(tools, (list, tuple)) and tools:
        dumped = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
        tail = "\n\n" + sys_text if sys_text else ""
        return f"<|im_start|>system\n{TOOLS_HEAD}{dumped}\n</tools>{TOOLS_INSTR}{tail}<|im_end|>\n"
    return f"<|im_start|>system\n{sys_text}<|im_end|>\n" if has_sys else ""


def _last_query_index(messages: list, vision: _Vision) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            text = _text(messages[i], vision, count=False)
            if not (text.startswith("<tool_response>") and text.endswith("</tool_response>")):
                return i
    raise ChatTemplateError("No user query found in messages.")


def _split_reasoning(message: Mapping, content: str) -> tuple[str, str]:
    """(reasoning, content) per spec section 5.1."""
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning.strip(), content
    if "</think>" not in content:
        return "", content
    before = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return before.strip(), content.split("</think>")[-1].lstrip("\n")


def _arg_value(value: Any, spec: TemplateSpec) -> str:
    if isinstance(value, str):
        return value
    if spec.qwen36 or isinstance(value, (Mapping, list, tuple)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _tool_calls(calls: Any, content: str, spec: TemplateSpec) -> str:
    """The ``<tool_call>`` blocks of one assistant message (spec section 6)."""
    if not calls or isinstance(calls, Mapping):
        return ""
    parts = []
    for k, call in enumerate(calls):
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise ChatTemplateError("Tool call must be an object.")
        name = fn.get("name")
        if not isinstance(name, str):
            raise ChatTemplateError("Tool call has no string 'name'.")
        sep = ("\n\n" if content.strip() else "") if k == 0 else "\n"
        parts.append(f"{sep}<tool_call>\n<function={name}>\n")
        args = fn.get("arguments", {})
        if not isinstance(args, Mapping):
            raise ChatTemplateError("Can only get item pairs from a mapping.")
        for key, value in args.items():
            parts.append(f"<parameter={key}>\n{_arg_value(value, spec)}\n</parameter>\n")
        parts.append("</function>\n</tool_call>")
    return "".join(parts)


def _assistant_turn(message: Mapping, content: str, keep: bool, spec: TemplateSpec) -> str:
    reasoning, content = _split_reasoning(message, content)
    think = f"{THINK_OPEN}{reasoning}\n</think>\n\n" if keep else ""
    calls = _tool_calls(message.get("tool_calls"), content, spec)
    return f"<|im_start|>assistant\n{think}{content}{calls}<|im_end|>\n"


def _tool_turn(messages: list, i: int, content: str) -> str:
    head = "<|im_start|>user" if i > 0 and messages[i - 1].get("role") != "tool" else ""
    last = i == len(messages) - 1 or messages[i + 1].get("role") != "tool"
    end = "<|im_end|>\n" if last else ""
    return f"{head}\n<tool_response>\n{content}\n</tool_response>{end}"


def _generation_prompt(spec: TemplateSpec, enable_thinking: Any) -> str:
    thinking = enable_thinking is not False if spec.thinking_default else enable_thinking is True
    return "<|im_start|>assistant\n" + (THINK_OPEN if thinking else THINK_EMPTY)


def render(messages: list[Mapping[str, Any]], tools: list[Mapping[str, Any]] | None = None, *,
           add_generation_prompt: bool = False, enable_thinking: bool | None = None,
           template: str | TemplateSpec = "qwen3.5-27b", preserve_thinking: bool | None = None,
           add_vision_id: bool = False) -> str:
    """Render a conversation exactly as the official Qwen3.5/3.6 chat template does.

    Messages are first passed through ``normalize_messages`` (JSON-string tool-call
    arguments decoded, etc.).

    Args:
        messages: OpenAI-style dicts: ``system`` (index 0 only), ``user``, ``assistant``
            (``content``, ``reasoning_content``, ``tool_calls``) and ``tool``. ``content``
            is a string, ``None`` or a list of parts (``{"type": "text", "text": ...}``,
            image/video parts).
        tools: tool schemas, dumped as given; only a non-empty list/tuple counts.
        add_generation_prompt: append ``<|im_start|>assistant\\n`` plus the think opener.
        enable_thinking: ``None`` = template default. Big sizes and Qwen3.6 think unless it
            is exactly ``False``; 0.8B/2B think only when it is exactly ``True``.
        template: a ``TEMPLATES`` name (``"qwen3.5-27b"``, ``"qwen3.5-0.8b"``,
            ``"qwen3.6-27b"``, other sizes) or a ``TemplateSpec``.
        preserve_thinking: Qwen3.6 only: exactly ``True`` keeps every think block.
        add_vision_id: prefix image/video placeholders with ``Picture N: ``/``Video N: ``.
    Returns:
        The prompt text (``str``).
    Raises:
        ChatTemplateError (a ``ValueError``): the template's own errors, same messages
            (spec section 9), e.g. ``"No user query found in messages."``.
        ValueError: unknown ``template`` name.
        TypeError: a message is not a mapping, or a value cannot be JSON-dumped.
    """
    spec = template_spec(template)
    if not messages:
        raise ChatTemplateError("No messages provided.")
    messages = normalize_messages(messages)
    if not all(isinstance(m, Mapping) for m in messages):
        raise TypeError("chat messages must be mappings")
    vision = _Vision(bool(add_vision_id))
    out = [_system_turn(messages, tools, vision)]
    last_query = _last_query_index(messages, vision)
    for i, message in enumerate(messages):
        content, role = _text(message, vision), message.get("role")
        if role == "system" and i != 0:
            raise ChatTemplateError("System message must be at the beginning.")
        if role == "user":
            out.append(f"<|im_start|>user\n{content}<|im_end|>\n")
        elif role == "assistant":
            keep = i > last_query or (spec.qwen36 and preserve_thinking is True)
            out.append(_assistant_turn(message, content, keep, spec))
        elif role == "tool":
            out.append(_tool_turn(messages, i, content))
        elif role != "system":
            raise ChatTemplateError("Unexpected message role.")
    if add_generation_prompt:
        out.append(_generation_prompt(spec, enable_thinking))
    return "".join(out)
