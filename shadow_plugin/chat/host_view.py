"""What a host served for each assistant turn of a recorded session.

For the assistant message at index i: the prompt is messages[:i] rendered with the host's
generation prompt and tokenised whole; the output is message i rendered after that generation
prompt, up to and including <|im_end|>, tokenised on its own (as a host's sampled ids would be).
BPE merges across the prompt/output boundary then show up as small rewrites of the next prompt,
as with a real host.
"""
from __future__ import annotations

from dataclasses import dataclass

from shadow_plugin.chat.messages import normalize_messages
from shadow_plugin.chat.renderer import Renderer

IM_END_TEXT = "<|im_end|>"


@dataclass(frozen=True)
class HostTurn:
    """index: the assistant message's index; prompt_ids, output_ids: what the host served and
    produced (token ids)."""

    index: int
    prompt_ids: list[int]
    output_ids: list[int]


def _output_text(full: str, prompt: str, base: str) -> str:
    """Message i's text after the generation prompt, through <|im_end|>."""
    message = full[len(base):]
    gen = prompt[len(base):]
    common = 0
    while common < min(len(gen), len(message)) and gen[common] == message[common]:
        common += 1
    out = message[common:]
    end = out.find(IM_END_TEXT)
    return out if end < 0 else out[:end + len(IM_END_TEXT)]


def host_turns(messages: list[dict], tools: list | None, renderer: Renderer, tokenizer,
               enable_thinking: bool | None = None) -> list[HostTurn]:
    """One HostTurn per assistant message (ValueError from the renderer for a malformed
    conversation, naming the template's message)."""
    messages = normalize_messages(messages)
    turns = []
    for i, m in enumerate(messages):
        if m.get("role") != "assistant" or i == 0:
            continue
        kw = {"enable_thinking": enable_thinking}
        base = renderer.render(messages[:i], tools, **kw)
        prompt = renderer.render(messages[:i], tools, add_generation_prompt=True, **kw)
        full = renderer.render(messages[:i + 1], tools, **kw)
        if not full.startswith(base) or not prompt.startswith(base):
            raise ValueError(f"message {i}: the rendering of earlier messages changed "
                             "when this one was added")
        turns.append(HostTurn(i, tokenizer.encode(prompt),
                              tokenizer.encode(_output_text(full, prompt, base))))
    return turns
