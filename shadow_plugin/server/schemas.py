"""Request and response bodies of the HTTP API (pydantic)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from shadow_plugin.server.config import MAX_QUESTIONS

MAX_TEXT_CHARS = 32_000       # a question or an instruction (about 8k tokens at most)
MAX_CHOICE_CHARS = 1_000
QUESTIONS_WHAT = ("at most SHADOW_MAX_QUESTIONS (8 by default; 400 past it), answered in "
                  "order in one forward, each as if asked alone")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(Strict):
    """A new turn: the whole prompt as ids, or as chat messages (+ tools) rendered here."""

    prompt_ids: list[StrictInt] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    profile: str | None = None
    router_label: str | None = None

    @model_validator(mode="after")
    def one_prompt(self):
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt_ids and messages")
        for i, m in enumerate(self.messages or []):
            check_message(i, m)
        return self


ROLES = ("system", "user", "assistant", "tool")


def check_message(i: int, m: dict) -> None:
    """Two of the Qwen3.5 template's refusals (docs/specs/qwen35-chat-format.md section 9), checked
    before it runs so the error names the message: a role outside ROLES, content that is not
    a string, a list of parts or None. Nothing the template renders is refused."""
    role = m.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
    content = m.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise ValueError(f"messages[{i}].content: {type(content).__name__} given, a string or "
                         "a list of parts expected")


def check_parts(i: int, content) -> None:
    """A chat question's content parts: each an object whose `text`, when it has one, is a
    string (ValueError naming messages[i].content[j]); parts of other types (images) are
    taken and ignored."""
    if not isinstance(content, list):
        return
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict):
            raise ValueError(f"{where}: {type(part).__name__} given, an object "
                             "({\"type\": \"text\", \"text\": ...}) expected")
        if "text" in part and not isinstance(part["text"], str):
            raise ValueError(f"{where}.text: {type(part['text']).__name__} given, a string "
                             "expected")


class FeedOut(BaseModel):
    """followed: False when the turn's profile has the shadow off (nothing else is set then)."""

    followed: bool = True
    first_difference: int | None = None
    rolled_back_from: int | None = None
    rolled_back_to: int | None = None
    backlog: int | None = None
    committed: int | None = None
    num_ids: int | None = None
    durable: bool | None = Field(default=None, description="the session's manifest holding "
                                 "this is on disk (null without a disk)")


class OutputIn(Strict):
    ids: list[StrictInt]
    position: StrictInt | None = Field(default=None, ge=0, description="how many ids the host "
                                       "has sent for this session before these; a mismatch "
                                       "is 409 (send the turn again)")


class HostIn(Strict):
    busy: StrictBool


class SliceOut(BaseModel):
    kind: str
    chunks: int
    ms: float
    stop: str


def check_choices(choices: list[str] | None, where: str = "choices") -> None:
    for i, c in enumerate(choices or []):
        if len(c) > MAX_CHOICE_CHARS:
            raise ValueError(f"{where}[{i}] is over {MAX_CHOICE_CHARS} characters")


class QuestionIn(Strict):
    """One letter-choice question of a list (AskIn.questions, ChatIn.questions)."""

    question: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    choices: list[str] = Field(min_length=2, max_length=26)

    @model_validator(mode="after")
    def short_choices(self):
        check_choices(self.choices)
        return self


class AskIn(Strict):
    """One question (`question` and `choices`: the answer is an AskOut), or a list of them
    about the same session and `at` (`questions`: the answer is an AskManyOut)."""

    session: str = Field(min_length=1, max_length=128)
    question: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT_CHARS)
    choices: list[str] | None = Field(default=None, min_length=2, max_length=26)
    questions: list[QuestionIn] | None = Field(default=None, min_length=1,
                                               max_length=MAX_QUESTIONS,
                                               description=QUESTIONS_WHAT)
    at: StrictInt | None = Field(default=None, ge=0)
    wait: StrictBool = False
    timeout_s: float = Field(default=10.0, gt=0, le=600)

    @model_validator(mode="after")
    def one_form(self):
        single = self.question is not None or self.choices is not None
        if single and self.questions is not None:
            raise ValueError("give question and choices, or questions (a list of them), "
                             "not both")
        if not single and self.questions is None:
            raise ValueError("give question and choices, or questions (a list of them): "
                             "neither was given")
        if single and (self.question is None or self.choices is None):
            raise ValueError("a question needs both question and choices")
        check_choices(self.choices)
        return self


class AskOut(BaseModel):
    label: str
    letter: str
    probs: list[float]
    ms: float
    backlog: int
    num_forwarded_tokens: int
    at: int
    beyond_max_positions: bool
    stale: bool = Field(default=False, description="the session came back from a restart "
                        "holding a prefix of what the host sent (`at` of it) until its next "
                        "turn")


class AskManyOut(BaseModel):
    """The answers of AskIn.questions, in their order."""

    answers: list[AskOut]


class SummarizeIn(Strict):
    session: str = Field(min_length=1, max_length=128)
    instruction: str = Field(default="Summarize this session in a few sentences.", min_length=1,
                             max_length=MAX_TEXT_CHARS)
    max_tokens: StrictInt = Field(default=128, ge=1, description="at most "
                                  "SHADOW_MAX_SUMMARY_TOKENS (4,096 by default; 400 past it)")
    at: StrictInt | None = Field(default=None, ge=0)


class SummarizeOut(BaseModel):
    text: str
    ids: list[int]
    ms_per_token: float
    prefill_ms: float
    stale: bool = Field(default=False, description="as an ask's: the session holds a prefix of "
                        "what the host sent until its next turn")


class ChatIn(BaseModel):
    """The questions in the OpenAI shape: `messages` (the last user message is the question),
    `session`, optional `at`; with `choices` a letter-choice answer, else a summary decoded
    with the question as its instruction (at most `max_tokens`). `n` (OpenAI's): that many
    choices of the one answer, all equal (the answer is greedy and exact, so n samples are n
    copies: it is computed once). `questions` (an extension, as `session`, `at` and `choices`
    are): several letter-choice questions about the session, answered in one forward, choice i
    answering questions[i] (`messages` may then be left out; `n`, if given, is their count).
    `wait` and `timeout_s` (extensions) as /v1/shadow/ask takes them, for letter-choice
    questions. Other OpenAI fields (model, temperature, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]] | None = Field(default=None, min_length=1)
    session: str = Field(min_length=1, max_length=128)
    at: StrictInt | None = Field(default=None, ge=0)
    choices: list[str] | None = Field(default=None, min_length=2, max_length=26)
    max_tokens: StrictInt = Field(default=128, ge=1, description="a summary's: at most "
                                  "SHADOW_MAX_SUMMARY_TOKENS (400 past it)")
    n: StrictInt | None = Field(default=None, ge=1, le=MAX_QUESTIONS, description="choices "
                                "of the one answer, all equal (computed once); with "
                                "`questions`: their count")
    questions: list[QuestionIn] | None = Field(default=None, min_length=1,
                                               max_length=MAX_QUESTIONS,
                                               description=QUESTIONS_WHAT)
    wait: StrictBool = Field(default=False, description="as /v1/shadow/ask's: answer once the "
                             "reader has read to the grid line at or below `at` (a letter-"
                             "choice question or `questions`; a summary does not wait)")
    timeout_s: float = Field(default=10.0, gt=0, le=600, description="the wait's limit (504 "
                             "past it)")

    @model_validator(mode="after")
    def a_question(self):
        for i, m in enumerate(self.messages or []):     # the messages first: what they hold
            check_message(i, m)                         # is named whatever else is wrong
            check_parts(i, m.get("content"))
        if self.wait and self.questions is None and not self.choices:
            raise ValueError("wait is for letter-choice questions (choices or questions); a "
                             "summary does not wait")
        if self.questions is not None:
            if self.choices is not None:
                raise ValueError("with questions each question has its own choices: leave "
                                 "out choices")
            if self.n is not None and self.n != len(self.questions):
                raise ValueError(f"n = {self.n} but {len(self.questions)} questions: n is "
                                 "their count (or leave it out)")
        elif self.messages is None:
            raise ValueError("give messages (the last user message is the question), or "
                             "questions")
        check_choices(self.choices)
        if self.questions is None:
            text = self.question()
            if not text.strip() or len(text) > MAX_TEXT_CHARS:
                raise ValueError(f"the last user message must hold 1 to {MAX_TEXT_CHARS} "
                                 "characters of text")
        return self

    def question(self) -> str:
        """The text of the last user message (text parts joined)."""
        users = [m for m in self.messages or [] if m.get("role") == "user"]
        if not users:
            return ""
        content = users[-1].get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)   # checked: check_parts
        return content
