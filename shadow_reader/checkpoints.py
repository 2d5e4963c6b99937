"""Checkpoint policy: where checkpoints go, which to keep, where a rewrite rolls back to.

Pure functions over `SessionState` lists and integers (no tensor math).

Placement: one at the grid line at or below the start of a turn's generation prompt (the prompt's
last `<|im_start|>`; the prompt's end when it has none), so that the rewrite a new user message
causes (it diverges right after `<|im_start|>assistant\\n` of the episode's first assistant turn,
specs/qwen35-chat-format.md section 13) lands at or above it.
Keeping: the checkpoint at the start of the current episode always stays; past `max_checkpoints`
the oldest other one goes.
"""
from __future__ import annotations

from .state import Checkpoint
from .tokenizer import CHAT_TOKENS

IM_START, TOOL_RESPONSE = CHAT_TOKENS.im_start, CHAT_TOKENS.tool_response
# Ordinary BPE ids of the Qwen3.5 vocabulary (specs/qwen35-chat-format.md section 11 example).
USER, ASSISTANT, NEWLINE = 846, 74455, 198


def prompt_line(prompt: list[int], grid: int) -> int:
    """Grid line at or below the start of the prompt's generation prompt."""
    end = len(prompt)
    for i in range(len(prompt) - 1, max(-1, len(prompt) - 16), -1):
        if prompt[i] == IM_START:
            end = i
            break
    return end // grid * grid


def is_episode_start(prompt: list[int]) -> bool:
    """True when the prompt's last message is a real user message, not tool responses: its last
    `<|im_start|>user\\n` (before the generation prompt) is not followed by `<tool_response>`."""
    found = []
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == IM_START:
            found.append(i)
            if len(found) == 2:
                break
    if not found:
        return False
    i = found[0]
    if prompt[i + 1:i + 2] == [ASSISTANT]:          # the generation prompt: look one further back
        if len(found) < 2:
            return False
        i = found[1]
    return prompt[i + 1:i + 3] == [USER, NEWLINE] and prompt[i + 3:i + 4] != [TOOL_RESPONSE]


def first_difference(held: list[int], new: list[int]) -> int:
    """First position where the two differ; min(len) when one is a prefix of the other."""
    n = min(len(held), len(new))
    for i in range(n):
        if held[i] != new[i]:
            return i
    return n


def rollback_target(checkpoints: list[Checkpoint], d: int) -> Checkpoint | None:
    """The newest checkpoint at or below position d, or None (roll back to 0)."""
    best = None
    for cp in checkpoints:
        if cp.pos <= d and (best is None or cp.pos > best.pos):
            best = cp
    return best


def add(checkpoints: list[Checkpoint], cp: Checkpoint, max_checkpoints: int) -> list[Checkpoint]:
    """Insert `cp` (replacing one at the same line), clear the episode mark of the others when
    `cp` starts an episode, and drop the oldest non-episode checkpoints past the cap."""
    same = [c for c in checkpoints if c.pos == cp.pos]
    cp.episode_start = cp.episode_start or any(c.episode_start for c in same)
    kept = [c for c in checkpoints if c.pos != cp.pos]
    if cp.episode_start:
        for c in kept:
            c.episode_start = False
    kept = sorted(kept + [cp], key=lambda c: c.pos)
    while len(kept) > max_checkpoints:
        oldest = next(c for c in kept if not c.episode_start)
        kept.remove(oldest)
    return kept
