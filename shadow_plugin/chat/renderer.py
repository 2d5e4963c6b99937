"""The renderer a host's prompts go through: a model directory's own Jinja chat template when it
has one (shadow_plugin.chat.templates, rendered the way transformers does), else the built-in
rendering of the official Qwen3.5/3.6 templates (shadow_plugin.chat.qwen_format.render)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from shadow_plugin.chat.messages import normalize_messages
from shadow_plugin.chat.qwen_format import render, template_spec
from shadow_plugin.chat.templates import compile_template, find_chat_template, render_compiled


@dataclass(frozen=True)
class Renderer:
    """Renders prompts with a model's own Jinja template, or the built-in renderer.

    Build with ``Renderer.from_model_dir``. Immutable; safe to share between threads.

    Attributes:
        template: built-in template name (used when ``jinja_source`` is ``None``).
        jinja_source: the model's Jinja chat template, if it has one.
        template_vars: extra variables for the Jinja template (special tokens).
    """

    template: str = "qwen3.5-27b"
    jinja_source: str | None = None
    template_vars: Mapping[str, Any] = field(default_factory=dict)
    _compiled: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path | None,
                       template: str = "qwen3.5-27b") -> Renderer:
        """Pick the model directory's chat template, else the built-in one.

        See ``shadow_plugin.chat.templates.find_chat_template`` for where it looks.

        Args:
            model_dir: a model directory, or ``None`` for the built-in renderer.
            template: built-in template name used when the directory has no template.
        Returns:
            A ``Renderer``.
        Raises:
            ValueError: unknown ``template`` name, or a malformed JSON config.
            FileNotFoundError: ``model_dir`` is given but is not a directory.
            jinja2.TemplateSyntaxError: the model's template does not parse.
        """
        template_spec(template)
        if model_dir is None:
            return cls(template)
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"model directory not found: {model_dir}")
        source, variables = find_chat_template(model_dir)
        if source is None:
            return cls(template)
        return cls(template, source, MappingProxyType(variables), compile_template(source))

    @property
    def uses_model_template(self) -> bool:
        """True when the model directory's own Jinja template is used."""
        return self.jinja_source is not None

    def render(self, messages: list[Mapping[str, Any]],
               tools: list[Mapping[str, Any]] | None = None, *,
               add_generation_prompt: bool = False, enable_thinking: bool | None = None,
               preserve_thinking: bool | None = None, **kwargs: Any) -> str:
        """Render ``normalize_messages(messages)`` with the chosen template.

        Args:
            messages, tools, add_generation_prompt, enable_thinking, preserve_thinking:
                as for ``render``; flags left ``None`` are not passed to a Jinja template.
            **kwargs: more template variables (Jinja) or ``add_vision_id`` (built-in).
        Returns:
            The prompt text.
        Raises:
            ChatTemplateError (a ``ValueError``) and the other errors of ``render`` /
            ``render_with_template``.
        """
        if self._compiled is None:
            return render(messages, tools, add_generation_prompt=add_generation_prompt,
                          enable_thinking=enable_thinking, template=self.template,
                          preserve_thinking=preserve_thinking, **kwargs)
        flags = {"enable_thinking": enable_thinking, "preserve_thinking": preserve_thinking}
        variables = {**self.template_vars, **{k: v for k, v in flags.items() if v is not None},
                     **kwargs}
        return render_compiled(self._compiled, normalize_messages(messages), tools,
                                add_generation_prompt, variables)
