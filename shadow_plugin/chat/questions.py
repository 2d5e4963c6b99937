"""Letter-choice questions: the question's ids on top of a session, and the letters' token ids.

A question is rendered as a user turn plus the assistant generation prompt with thinking off
(docs/design.md, "Questions"):
    <|im_start|>user\\n{question}\\n\\nA. {choice 0}\\nB. {choice 1}...\\n\\n{instruction}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
preceded by "\\n" when the ids before it end with <|im_end|> (a closed message) and by
"<|im_end|>\\n" when they stop inside a message. The answer is the softmax over the logits of the
letters A, B, ... (one token each) at the last position.
"""
from __future__ import annotations

from dataclasses import dataclass

from shadow_plugin import validate
from shadow_plugin.chat.tokenizer import CHAT_TOKENS

IM_END = CHAT_TOKENS.im_end
STOP_IDS = (CHAT_TOKENS.im_end, CHAT_TOKENS.endoftext)     # where a fork's decoding stops
INSTRUCTION = "Answer with the letter of one choice only."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Answer:
    """label: the chosen choice's text; letter: its letter; probs: one per choice (sum 1);
    ms: wall time of the ask; num_forwarded_tokens: ids run through the model (scratch chunks,
    the pending tail and the question); num_committed: ids the session committed on the way
    (whole chunks up to the grid line at or below `at`); backlog: len(ids) - C when asked; at:
    the position asked at; beyond_max_positions: the forward went past the model's
    max_position_embeddings; stale: the session came back from a restart holding a prefix of
    what the host sent (Reader.stale), so this answers about that prefix."""

    label: str
    letter: str
    probs: tuple[float, ...]
    ms: float
    num_forwarded_tokens: int
    num_committed: int
    backlog: int
    at: int
    beyond_max_positions: bool = False
    stale: bool = False


def question_text(question: str, choices: list[str], prefix: str) -> str:
    lines = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices))
    return (f"{prefix}<|im_start|>user\n{question}\n\n{lines}\n\n{INSTRUCTION}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def turn_prefix(previous_id: int | None) -> str:
    """What closes the ids before a new user turn: "" for an empty session, "\n" after
    <|im_end|>, "<|im_end|>\n" inside a message."""
    if previous_id is None:
        return ""
    return "\n" if previous_id == IM_END else "<|im_end|>\n"


def question_ids(tokenizer, question: str, choices: list[str], previous_id: int | None) -> list[int]:
    """Token ids of the question on top of ids ending with `previous_id` (None: empty session).

    `tokenizer.encode(text) -> list[int]` must map special tokens to their ids."""
    return tokenizer.encode(question_text(question, choices, turn_prefix(previous_id)))


def instruction_ids(tokenizer, instruction: str, previous_id: int | None) -> list[int]:
    """A user turn holding `instruction`, then the assistant generation prompt without thinking
    (the prompt of a summary fork)."""
    return tokenizer.encode(f"{turn_prefix(previous_id)}<|im_start|>user\n{instruction}"
                            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def letter_ids(tokenizer, num_choices: int) -> list[int]:
    """Token id of each letter; raises ValueError if a letter is not exactly one token."""
    out = []
    for letter in LETTERS[:num_choices]:
        ids = tokenizer.encode(letter)
        if len(ids) != 1:
            raise ValueError(f"letter {letter!r} is {len(ids)} tokens in this tokenizer, need 1")
        out.append(ids[0])
    return out


def render(tokenizer, vocab_size: int, ids, question, choices,
           at: int) -> tuple[list[int], list[int], list[str]]:
    """A question over ids[:at] (ids: the session's, a list or an int64 array): text rendered
    as a user turn after ids[at - 1] (question_ids), or a list of ids checked against
    vocab_size; with the letters' ids and the choices checked: (q_ids, letters, choices).
    Raises ValueError for bad choices, an empty question or bad ids."""
    choices = validate.choices(choices)
    if isinstance(question, str):
        if not question.strip():
            raise ValueError("question must not be empty")
        q_ids = question_ids(tokenizer, question, choices, int(ids[at - 1]) if at else None)
    else:
        q_ids = validate.token_ids(question, vocab_size, "question")
        if not q_ids:
            raise ValueError("question ids must not be empty")
    return q_ids, letter_ids(tokenizer, len(choices)), choices


def render_many(tokenizer, vocab_size: int, ids, items,
                at: int) -> list[tuple[list[int], list[int], list[str]]]:
    """`render` for each (question, choices) of items (a non-empty list of pairs, not a
    string or a mapping). Raises ValueError naming the item ("questions[i]: ...")."""
    items = validate.items(items, "questions must be a non-empty list of (question, choices)")
    if not items:
        raise ValueError("questions must be a non-empty list of (question, choices)")
    out = []
    for i, item in enumerate(items):
        try:
            if isinstance(item, (dict, str, bytes)):     # a dict unpacks to its keys
                raise ValueError(f"a (question, choices) pair expected, got a "
                                 f"{type(item).__name__}")
            question, choices = item
            out.append(render(tokenizer, vocab_size, ids, question, choices, at))
        except (TypeError, ValueError) as e:
            raise ValueError(f"questions[{i}]: {e}") from None
    return out


def render_prompt(tokenizer, vocab_size: int, ids, prompt, at: int) -> list[int]:
    """A decoding's prompt over ids[:at]: text as a user turn with the generation prompt
    (instruction_ids), or a list of ids checked against vocab_size. Raises ValueError for an
    empty or bad prompt."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt must not be empty")
        return instruction_ids(tokenizer, prompt, int(ids[at - 1]) if at else None)
    p_ids = validate.token_ids(prompt, vocab_size, "prompt")
    if not p_ids:
        raise ValueError("prompt ids must not be empty")
    return p_ids
