"""Profiles and the router question in shadow mode.

Profiles (YAML, `SHADOW_PROFILES`): `{name: {shadow: {mode: on|off, narrator: on|off,
router: off|shadow, router_min_tokens: 8192}}}`; a turn names its profile. For a turn whose
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

from shadow_plugin.chat.router import ROUTER
from shadow_plugin.chat.tokenizer import CHAT_TOKENS


@dataclass(frozen=True)
class Profile:
    mode: bool = True
    narrator: bool = False
    router: bool = False
    router_min_tokens: int = 8192


def _on(value, name: str) -> bool:
    if value in (True, "on", "true"):
        return True
    if value in (False, None, "off", "false"):
        return False
    raise ValueError(f"profile field {name}: expected on or off, got {value!r}")


def load_profiles(path: str | Path | None) -> dict[str, Profile]:
    """Profiles from a YAML file (none: {}). ValueError naming a malformed profile."""
    if not path:
        return {}
    import yaml
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ValueError(f"SHADOW_PROFILES={str(path)!r}: not a readable YAML file{at}: "
                         f"{getattr(e, 'problem', None) or e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"SHADOW_PROFILES={str(path)!r}: expected a mapping of profile names")
    out = {}
    for name, body in raw.items():
        if body is not None and not isinstance(body, dict):
            raise ValueError(f"profile {name!r}: expected a mapping with a 'shadow' entry")
        block = (body or {}).get("shadow") or {}
        if not isinstance(block, dict):
            raise ValueError(f"profile {name!r}: 'shadow' must be a mapping")
        router = block.get("router", "off")
        if router not in ("off", "shadow", False, None):
            raise ValueError(f"profile {name!r}: router must be off or shadow, got {router!r}")
        out[str(name)] = Profile(_on(block.get("mode", "on"), "mode"),
                                 _on(block.get("narrator", "off"), "narrator"),
                                 router == "shadow", int(block.get("router_min_tokens", 8192)))
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
