"""A model directory's own Jinja chat template, found and rendered the way transformers does
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, `raise_exception`, `tojson` with
ensure_ascii=False, loop controls, `{% generation %}` tags rendered as their body)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from shadow_plugin.chat.tokenizer import ChatTemplateError, read_json


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _generation_tag():
    """A ``{% generation %}...{% endgeneration %}`` tag that just renders its body."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag


def compile_template(template_str: str):
    """Compile a chat template in a transformers-like Jinja environment.

    Sandboxed (``ImmutableSandboxedEnvironment``), ``trim_blocks`` and ``lstrip_blocks``
    on, ``loopcontrols`` and a pass-through ``{% generation %}`` tag, a ``tojson`` filter
    with ``ensure_ascii=False`` and no key sorting, and ``raise_exception`` /
    ``strftime_now`` globals.

    Args:
        template_str: the Jinja source.
    Returns:
        A ``jinja2.Template``.
    Raises:
        jinja2.TemplateSyntaxError: the template does not parse.
    """
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_tag(), loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template_str)


def _transformers_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """transformers' own preparation: drop ``None`` keys, alias reasoning fields."""
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {message!r}")
        message = {k: v for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in ("reasoning_content", "thinking", "reasoning")
                          if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_compiled(compiled, messages: list[Mapping[str, Any]], tools: Any,
                    add_generation_prompt: bool, variables: Mapping[str, Any]) -> str:
    """Render a ``compile_template`` result like ``render_with_template`` does.

    Args:
        compiled: from ``compile_template``.
        messages, tools, add_generation_prompt: template variables.
        variables: more template variables.
    Returns:
        The rendered text.
    Raises:
        See ``render_with_template``.
    """
    return compiled.render(messages=_transformers_messages(messages), tools=tools,
                           documents=None, add_generation_prompt=add_generation_prompt, **variables)


def render_with_template(template_str: str, messages: list[Mapping[str, Any]],
                         tools: list[Mapping[str, Any]] | None = None,
                         add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """Render a model-provided Jinja chat template the way transformers does.

    Like transformers' ``apply_chat_template(..., tokenize=False)``: message keys whose
    value is ``None`` are dropped and ``reasoning_content``/``thinking``/``reasoning`` are
    aliased; nothing else is changed (call ``normalize_messages`` first for vLLM's
    tool-argument decoding; ``Renderer`` does).

    Args:
        template_str: Jinja source (e.g. a ``chat_template.jinja``).
        messages: message dicts.
        tools: tool schemas or ``None``, passed as ``tools``.
        add_generation_prompt: passed as ``add_generation_prompt``.
        **kwargs: more template variables (``enable_thinking``, ``bos_token``, ...).
    Returns:
        The rendered text.
    Raises:
        ChatTemplateError (a ``ValueError``): the template called ``raise_exception``.
        jinja2.TemplateError: syntax or sandbox errors; TypeError etc. from filters.
    """
    return render_compiled(compile_template(template_str), messages, tools,
                            add_generation_prompt, kwargs)


def _template_from_config(config: Mapping[str, Any]) -> str | None:
    """``chat_template`` of tokenizer_config.json: a string, or the ``default`` one of a list."""
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        value = named.get("default")
    return value if isinstance(value, str) else None


def find_chat_template(directory: str | Path) -> tuple[str | None, dict[str, str]]:
    """Find a model directory's own chat template, as transformers does.

    Looks, in order, for ``chat_template.jinja``, ``chat_template.json`` (processor
    format) and ``chat_template`` in ``tokenizer_config.json`` (a string, or the
    ``default`` entry of a list of named templates).

    Args:
        directory: the model directory.
    Returns:
        ``(source, variables)``: the Jinja source or ``None``, and the special-token
        template variables (``bos_token``, ``eos_token``, ...) from tokenizer_config.json.
    Raises:
        ValueError: a JSON file is malformed.
    """
    directory = Path(directory)
    config = read_json(directory / "tokenizer_config.json")
    variables = _special_token_vars(config)
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8"), variables
    processor = read_json(directory / "chat_template.json").get("chat_template")
    if isinstance(processor, str):
        return processor, variables
    return _template_from_config(config), variables


def _special_token_vars(config: Mapping[str, Any]) -> dict[str, str]:
    """``bos_token`` etc. from tokenizer_config.json, as transformers passes them."""
    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, Mapping) else value
        if isinstance(value, str):
            out[key] = value
    return out
