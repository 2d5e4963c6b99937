"""The narrator: at the end of each host thought (`</think>` in the output) of a session whose
profile has `narrator: on`, the shadow reads what it misses up to that point and decodes a short
summary of the thought on top of the whole session (a fork: nothing of the session changes).

Jobs run in the idle window, or between the host's rounds within the narrator's share: `share`
(3 %) of the time since the host's first token of the turn, minus what narration used in the
turn; a job runs when its estimated cost (the last narration's ms, `default_ms` before any)
fits. Summaries are kept per session (the newest `keep`).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from shadow_plugin.chat.tokenizer import CHAT_TOKENS

INSTRUCTION = "In one sentence, what did the assistant just think through?"


@dataclass
class Narrator:
    share: float = 0.03
    max_tokens: int = 48
    default_ms: float = 500.0
    keep: int = 50
    jobs: deque = field(default_factory=deque)             # (session, at)
    narrations: dict = field(default_factory=dict)         # session -> deque of dicts
    used_ms: dict = field(default_factory=dict)            # session -> ms used this turn
    last_ms: float | None = None

    def on_output(self, session: str, start: int, new_ids: list[int]) -> None:
        """Queue a job at each `</think>` among ids appended at position `start`."""
        for i, t in enumerate(new_ids):
            if t == CHAT_TOKENS.end_think:
                self.jobs.append((session, start + i + 1))

    def turn_started(self, session: str) -> None:
        self.used_ms[session] = 0.0

    def budget_ms(self, session: str, first_token_s: float | None, now_s: float) -> float:
        if first_token_s is None:
            return 0.0
        return self.share * (now_s - first_token_s) * 1e3 - self.used_ms.get(session, 0.0)

    def estimate_ms(self) -> float:
        return self.last_ms if self.last_ms is not None else self.default_ms

    def run_one(self, reader, session: str | None = None) -> dict | None:
        """Run the oldest job (of `session` when given); returns the narration or None."""
        job = next((j for j in self.jobs if session is None or j[0] == session), None)
        if job is None:
            return None
        self.jobs.remove(job)
        sid, at = job
        try:
            t0 = time.perf_counter()
            text, gen = reader.summarize(sid, INSTRUCTION, self.max_tokens,
                                         min(at, len(reader.ids(sid))))
        except KeyError:                     # the session was dropped meanwhile
            return None
        ms = (time.perf_counter() - t0) * 1e3
        self.last_ms = ms
        self.used_ms[sid] = self.used_ms.get(sid, 0.0) + ms
        item = {"at": at, "text": text, "ms": round(ms, 1),
                "ms_per_token": round(gen.ms_per_token, 2), "time": time.time()}
        self.narrations.setdefault(sid, deque(maxlen=self.keep)).append(item)
        return item
