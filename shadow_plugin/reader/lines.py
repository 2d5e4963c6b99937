"""Where checkpoints belong: the chat-aware grid lines the reader hands down to the block store.

One at the grid line at or below the start of a turn's generation prompt (the prompt's last
`<|im_start|>`; the prompt's end when it has none), so that the rewrite a new user message
causes (it diverges right after `<|im_start|>assistant\\n` of the episode's first assistant
turn, docs/specs/qwen35-chat-format.md section 13) lands at or above it. A prompt whose last
message is a real user message starts an episode; its checkpoint is kept. One at the line at or
below the end of the first system message (`shared_line`): what every session of one agent
starts with, kept for the sessions that follow.
"""
from __future__ import annotations

from shadow_plugin.chat.tokenizer import CHAT_TOKENS

IM_START, TOOL_RESPONSE = CHAT_TOKENS.im_start, CHAT_TOKENS.tool_response
IM_END = CHAT_TOKENS.im_end
# Ordinary BPE ids of the Qwen3.5 vocabulary (docs/specs/qwen35-chat-format.md section 11).
USER, ASSISTANT, NEWLINE = 846, 74455, 198


def prompt_line(prompt: list[int], grid: int) -> int:
    """Grid line at or below the start of the prompt's generation prompt."""
    end = len(prompt)
    for i in range(len(prompt) - 1, max(-1, len(prompt) - 16), -1):
        if prompt[i] == IM_START:
            end = i
            break
    return end // grid * grid


SCAN_BLOCK = 4096      # ids a backward search of last_index takes at a time


def last_index(prompt: list[int], value: int, end: int) -> int:
    """The last position below `end` that holds `value`, or -1. Searches slices of SCAN_BLOCK
    ids from the end with C's `in` and `index` (a long last message, a tool's output of
    50k ids, is crossed at C's speed, not one id at a time in Python)."""
    end = min(end, len(prompt))
    while end > 0:
        lo = max(0, end - SCAN_BLOCK)
        block = prompt[lo:end]
        if value in block:
            return end - 1 - block[::-1].index(value)
        end = lo
    return -1


def is_episode_start(prompt: list[int]) -> bool:
    """True when the prompt's last message is a real user message, not tool responses: its last
    `<|im_start|>user\\n` (before the generation prompt) is not followed by `<tool_response>`.
    is_episode_start_ref is its twin, one id at a time."""
    last = last_index(prompt, IM_START, len(prompt))
    if last < 0:
        return False
    if prompt[last + 1:last + 2] != [ASSISTANT]:     # not the generation prompt: this one
        return _ends_episode(prompt, [last])
    before = last_index(prompt, IM_START, last)
    return _ends_episode(prompt, [last] if before < 0 else [last, before])


def is_episode_start_ref(prompt: list[int]) -> bool:
    """is_episode_start, scanning back one id at a time (its twin in tests)."""
    found = []
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_START:
            found.append(i)
            if len(found) == 2:
                break
    if not found:
        return False
    return _ends_episode(prompt, found)


def _ends_episode(prompt: list[int], found: list[int]) -> bool:
    """found: the last one or two `<|im_start|>` positions, the last first."""
    i = found[0]
    if prompt[i + 1:i + 2] == [ASSISTANT]:          # the generation prompt: look one further back
        if len(found) < 2:
            return False
        i = found[1]
    return prompt[i + 1:i + 3] == [USER, NEWLINE] and prompt[i + 3:i + 4] != [TOOL_RESPONSE]


SYSTEM = 8678          # "system", an ordinary BPE id of the Qwen3.5 vocabulary (tests check it)
MAX_SHARED_SCAN = 1 << 17     # ids looked at for the first system message's end


def shared_line(prompt: list[int], grid: int) -> int:
    """Grid line at or below the end of the prompt's first system message (its
    `<|im_end|>`), where one agent's sessions stop sharing a prefix (its system prompt and
    tools); 0 when the prompt does not start with `<|im_start|>system` or the message does not
    end within MAX_SHARED_SCAN ids."""
    if prompt[:2] != [IM_START, SYSTEM]:
        return 0
    try:
        end = prompt.index(IM_END, 0, MAX_SHARED_SCAN)
    except ValueError:
        return 0
    return end // grid * grid
