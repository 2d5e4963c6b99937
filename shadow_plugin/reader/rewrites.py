"""What kind of rewrite a prompt is, where it differs from the ids held (docs/design.md,
"rewrites"): 'bpe' when the held ids' text from the first difference on is still the start
of the new prompt's text (the same text tokenised otherwise: the host's output met the next
prompt and BPE merged across the boundary), 'template' when the text differs (the chat
template dropped or changed earlier content). The re-read counters are kept under these
causes; a prompt that extends the held ids is no rewrite (None).
"""
from __future__ import annotations

MAX_TEXT_IDS = 8192     # ids decoded on each side at most: past them, a rewrite is 'template'
SLACK_IDS = 16          # the new prompt's side may need a few more ids for the same text


def classify(held: list[int], prompt: list[int], d: int, tokenizer) -> str | None:
    """None when d == len(held) (no held id differs); else 'bpe' or 'template' as the module
    says, or 'other' when the tokenizer cannot decode these ids (any error while decoding).
    Decodes at most MAX_TEXT_IDS + SLACK_IDS ids."""
    if d >= len(held):
        return None
    n = len(held) - d
    if n > MAX_TEXT_IDS:
        return "template"
    try:
        old = tokenizer.decode(list(held[d:]))
        new = tokenizer.decode(list(prompt[d:d + n + SLACK_IDS]))
    except Exception:           # a tokenizer that cannot decode these ids: no cause to tell
        return "other"
    return "bpe" if new.startswith(old) else "template"
