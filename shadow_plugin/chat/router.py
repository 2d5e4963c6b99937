"""The default router question: which of 9 classes the session's latest turn belongs to.

One letter a class (questions.LETTERS); the label reported is the class name. A question file
(`replay --question FILE`) is JSON: {"question": str, "choices": [str, ...], "labels": [str, ...]}
with labels optional (default: the choices themselves).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shadow_plugin import validate


@dataclass(frozen=True)
class Question:
    """question: the text; choices: one line per letter; labels: the name reported per choice."""

    question: str
    choices: tuple[str, ...]
    labels: tuple[str, ...]


ROUTER = Question(
    question=("You are routing a coding assistant's session. Read the whole conversation above. "
              "Which kind of work is the user's most recent request?"),
    choices=(
        "chat: conversation or a quick question, no code needed",
        "code_edit: write or change code in the project",
        "debug: find and fix a bug, an error or a failing command",
        "design_ui: design or style a user interface",
        "explain: explain how code, a tool or a concept works",
        "plan: plan the work, break a task into steps",
        "refactor: restructure existing code without changing behaviour",
        "review: review code or a change and give feedback",
        "test: write, run or fix tests",
    ),
    labels=("chat", "code_edit", "debug", "design_ui", "explain", "plan", "refactor", "review",
            "test"),
)


def load_question(path: str | Path | None) -> Question:
    """The router question, or the one in a JSON file. Raises ValueError for a malformed file."""
    if path is None:
        return ROUTER
    raw = validate.json_file(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("question"), str):
        raise ValueError(f"{path}: expected an object with a 'question' string")
    choices = validate.choices(raw.get("choices"))
    labels = raw.get("labels") or choices
    if len(labels) != len(choices) or len(set(labels)) != len(labels):
        raise ValueError(f"{path}: need {len(choices)} distinct labels, got {labels!r}")
    return Question(raw["question"], tuple(choices), tuple(str(x) for x in labels))
