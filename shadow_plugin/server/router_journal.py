"""Profiles and the router question in shadow mode.

Profiles (YAML, `SHADOW_PROFILES`): `{name: {shadow: {mode: on|off, narrator: on|off,
router: off|shadow, router_min_tokens: 8192}}}` (every key checked by name and type, pydantic;
nothing else in a profile); a turn names its profile. For a turn whose
prompt has at least router_min_tokens ids and whose profile says `router: shadow`, the router's
class question is asked at the turn's insertion point (after the prompt's last <|im_end|>) when
the reader reaches it, and one JSON line is appended to `<SHADOW_DIR>/shadow.jsonl`: time,
session, turn, label, probability, the host router's label, agreement, backlog at turn start,
lag. Nothing of the turn changes.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt, ValidationError

from shadow_plugin.chat.router import ROUTER
from shadow_plugin.chat.tokenizer import CHAT_TOKENS


@dataclass(frozen=True)
class Profile:
    mode: bool = True
    narrator: bool = False
    router: bool = False
    router_min_tokens: int = 8192


def _on(value):
    """on/off (YAML's on, true, yes and off, false, no and null, as read) -> bool."""
    if value in (True, "on", "true"):
        return True
    if value in (False, None, "off", "false"):
        return False
    raise ValueError("expected on or off")


def _router(value):
    """off/shadow (YAML's off read as False, null as off) -> bool: whether the router's
    question is asked."""
    if value in ("off", False, None):
        return False
    if value == "shadow":
        return True
    raise ValueError("expected off or shadow")


OnOff = Annotated[bool, BeforeValidator(_on)]
RouterMode = Annotated[bool, BeforeValidator(_router)]


class ShadowBlock(BaseModel):
    """A profile's `shadow:` block, every key checked by name and type."""

    model_config = ConfigDict(extra="forbid")
    mode: OnOff = True
    narrator: OnOff = False
    router: RouterMode = False
    router_min_tokens: StrictInt = Field(8192, ge=1)


class ProfileBody(BaseModel):
    """A profile: its `shadow:` block and nothing else."""

    model_config = ConfigDict(extra="forbid")
    shadow: ShadowBlock | None = None


def _first_error(e: ValidationError) -> str:
    """The first error of a profile's validation as `key: what` (an unknown key named as
    such, with the known ones)."""
    err = e.errors()[0]
    key = ".".join(str(x) for x in err["loc"]) or "(the profile)"
    if err["type"] == "extra_forbidden":
        known = ShadowBlock.model_fields if len(err["loc"]) > 1 else ProfileBody.model_fields
        return f"{key}: unknown key (known: {', '.join(known)})"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{key}: {msg} (got {err.get('input')!r})"


def load_profiles(path: str | Path | None) -> dict[str, Profile]:
    """Profiles from a YAML file (none: {}). ValueError (one line naming the file, the profile
    and the key) for an unreadable file, a profile that is not a mapping, an unknown key
    (inside or outside its `shadow:` block) or a value of the wrong type or range."""
    if not path:
        return {}
    import yaml
    where = f"SHADOW_PROFILES={str(path)!r}"
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1})" if mark is not None else ""
        raise ValueError(f"{where}: not a readable YAML file{at}: "
                         f"{getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping of profile names")
    out = {}
    for name, body in raw.items():
        if body is not None and not isinstance(body, dict):
            raise ValueError(f"{where}: profile {name!r}: expected a mapping with a 'shadow' "
                             f"entry, got {type(body).__name__}")
        try:
            block = ProfileBody.model_validate(body or {}).shadow or ShadowBlock()
        except ValidationError as e:
            raise ValueError(f"{where}: profile {name!r}: {_first_error(e)}") from None
        out[str(name)] = Profile(block.mode, block.narrator, block.router,
                                 block.router_min_tokens)
    return out


def insertion_point(prompt: list[int]) -> int:
    """Position right after the prompt's last <|im_end|> (its length when there is none)."""
    for i in range(len(prompt) - 1, -1, -1):
        if prompt[i] == CHAT_TOKENS.im_end:
            return i + 1
    return len(prompt)


class RouterJournal:
    """Pending router questions by (session, at) and the journal file they are written to."""

    def __init__(self, path: Path):
        self.path = path
        self.pending: dict[tuple[str, int], dict] = {}
        self.turns: dict[str, int] = {}
        self.agree = self.total = 0
        self._lock = threading.Lock()

    def expect(self, session: str, at: int, router_label: str | None, backlog: int) -> None:
        self.turns[session] = self.turns.get(session, 0) + 1
        self.pending[(session, at)] = {"turn": self.turns[session], "router_label": router_label,
                                       "backlog_at_turn_start": backlog, "t0": time.time()}

    def answer(self, reader, session: str, at: int) -> dict | None:
        """Ask the router question at `at` and append the journal line; None if not pending."""
        meta = self.pending.pop((session, at), None)
        if meta is None:
            return None
        ans = reader.ask(session, ROUTER.question, list(ROUTER.choices), at=at)
        label = ROUTER.labels[ROUTER.choices.index(ans.label)]
        agree = None if meta["router_label"] is None else label == meta["router_label"]
        line = {"time": time.time(), "session": session, "turn": meta["turn"], "label": label,
                "probability": max(ans.probs), "router_label": meta["router_label"],
                "agreement": agree, "backlog_at_turn_start": meta["backlog_at_turn_start"],
                "lag_s": round(time.time() - meta["t0"], 3)}
        with self._lock:
            if agree is not None:
                self.total += 1
                self.agree += int(agree)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(line) + "\n")
        return line
