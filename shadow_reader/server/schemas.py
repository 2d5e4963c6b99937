"""Request and response bodies of the HTTP API (pydantic)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(Strict):
    """A new turn: the whole prompt as ids, or as chat messages (+ tools) rendered here."""

    prompt_ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    profile: str | None = None
    router_label: str | None = None

    @model_validator(mode="after")
    def one_prompt(self):
        if (self.prompt_ids is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt_ids and messages")
        return self


class FeedOut(BaseModel):
    """followed: False when the turn's profile has the shadow off (nothing else is set then)."""

    followed: bool = True
    first_difference: int | None = None
    rolled_back_from: int | None = None
    rolled_back_to: int | None = None
    backlog: int | None = None
    committed: int | None = None
    num_ids: int | None = None


class OutputIn(Strict):
    ids: list[int]


class HostIn(Strict):
    busy: bool


class SliceOut(BaseModel):
    kind: str
    chunks: int
    ms: float
    stop: str


class AskIn(Strict):
    session: str = Field(min_length=1, max_length=256)
    question: str = Field(min_length=1)
    choices: list[str] = Field(min_length=2, max_length=26)
    at: int | None = Field(default=None, ge=0)
    wait: bool = False
    timeout_s: float = Field(default=10.0, gt=0, le=600)


class AskOut(BaseModel):
    label: str
    letter: str
    probs: list[float]
    ms: float
    backlog: int
    num_forwarded_tokens: int
    at: int
    beyond_max_positions: bool


class SummarizeIn(Strict):
    session: str = Field(min_length=1, max_length=256)
    instruction: str = Field(default="Summarize this session in a few sentences.", min_length=1)
    max_tokens: int = Field(default=128, ge=1, le=4096)
    at: int | None = Field(default=None, ge=0)


class SummarizeOut(BaseModel):
    text: str
    ids: list[int]
    ms_per_token: float
    prefill_ms: float
