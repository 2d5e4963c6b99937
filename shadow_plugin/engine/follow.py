"""Following a serving engine that knows requests, not sessions (vLLM): its request lifecycle
becomes request events on the engine's scheduler side (`RequestTracker`, integers only), and
the events become the host interface's session events where the shadow lives (`Follower`).

A request names its session when the client passes one (while another running request holds
that name, `name:<request id>`); otherwise it continues the session
whose ids its prompt holds, all but at most that session's last page (a re-rendered tail, a
BPE merge at the boundary) and at least half of them, and which no other request is extending;
otherwise it starts a new session `req-<request id>`. Two sessions that share more than all
but one page of one of them (an agent's system prompt and a first message) cannot be told
apart this way: name sessions when that matters. Events are proportional to the new ids: a
prompt once, then only the output ids not sent before.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

from shadow_plugin.validate import HTTP_SESSION_RE

log = logging.getLogger(__name__)
MAX_NAMES_LOGGED = 1024       # names remembered as logged (then the set starts again)

START, OUTPUT, FINISH = "start", "output", "finish"


@dataclass(frozen=True)
class RequestEvent:
    """kind: START (ids: the whole prompt; session: the client's name for it, or None),
    OUTPUT (ids: output ids new since the last event) or FINISH (ids: none)."""

    kind: str
    request_id: str
    ids: tuple[int, ...] = ()
    session: str | None = None


@dataclass
class RequestTracker:
    """Turns a request's lifecycle into RequestEvents, in order, until `take`n. Holds per
    running request the number of output ids already sent."""

    sent: dict[str, int] = field(default_factory=dict)
    events: list[RequestEvent] = field(default_factory=list)

    def start(self, request_id: str, prompt_ids: Sequence[int], session: str | None) -> None:
        """A request's prompt, once (a second start of a running request is ignored)."""
        if request_id in self.sent:
            return
        self.sent[request_id] = 0
        self.events.append(RequestEvent(START, request_id, tuple(prompt_ids), session))

    def progress(self, request_id: str, output_ids: Sequence[int]) -> None:
        """All the output ids the request has so far; only those not sent before go out."""
        done = self.sent.get(request_id)
        if done is None or len(output_ids) <= done:
            return
        self.events.append(RequestEvent(OUTPUT, request_id, tuple(output_ids[done:])))
        self.sent[request_id] = len(output_ids)

    def finish(self, request_id: str, output_ids: Sequence[int]) -> None:
        if request_id not in self.sent:
            return
        self.progress(request_id, output_ids)
        del self.sent[request_id]
        self.events.append(RequestEvent(FINISH, request_id))

    @property
    def pending(self) -> bool:
        return bool(self.events)

    def take(self) -> list[RequestEvent]:
        out, self.events = self.events, []
        return out


class Follower:
    """Applies RequestEvents to a door (server.facade.Shadow: turn, output, end, reader),
    matching unnamed requests to sessions through the ids the reader holds (Reader.position,
    Reader.held_starts_with: nothing restored). `grid`: the page length for the match rule."""

    def __init__(self, door, grid: int):
        self.door, self.grid = door, grid
        self.sessions: dict[str, str] = {}         # running request id -> session
        self.logged_names: set[str] = set()        # client names refused and logged once

    def apply(self, events: Sequence[RequestEvent]) -> None:
        """Apply events in order; a bad event (ids outside the vocabulary, an unknown request)
        is skipped and reported by the ValueError/KeyError it raised, after the others ran."""
        errors = []
        for ev in events:
            try:
                self._apply(ev)
            except (ValueError, KeyError) as e:
                errors.append(f"{ev.kind} {ev.request_id}: {e}")
        if errors:
            raise ValueError("; ".join(errors))

    def _apply(self, ev: RequestEvent) -> None:
        if ev.kind == START:
            session = self._session_for(ev)
            # under the events thread's hold: its pages were read ahead before it
            # (EmbeddedShadow._prefetch); a refused turn raises, and the request is not followed
            self.door.turn(session, list(ev.ids), None, None, require_durable=False,
                           read_ahead=False)
            self.sessions[ev.request_id] = session
        elif ev.kind == OUTPUT:
            session = self.sessions.get(ev.request_id)
            if session is not None:               # else its turn was refused
                try:
                    self.door.output(session, list(ev.ids), require_durable=False)
                except (ValueError, KeyError):    # the rest of this request is not followed
                    del self.sessions[ev.request_id]
                    raise
        elif ev.kind == FINISH:
            session = self.sessions.pop(ev.request_id, None)
            if session is not None:
                self.door.end(session, require_durable=False)
        else:
            raise ValueError(f"unknown event kind {ev.kind!r}")

    def _session_for(self, ev: RequestEvent) -> str:
        """The client's name (while another running request holds it: `name:<request id>`;
        a name the HTTP routes could not ask about is not used), else the session the prompt
        continues, else a new one."""
        named = ev.session
        if named and named in set(self.sessions.values()):
            named = f"{named}:{ev.request_id}"
        if named and HTTP_SESSION_RE.fullmatch(named):
            return named
        session = self.match(ev.ids) or f"req-{ev.request_id}"[:128]
        if named:
            self._log_refused(ev.session, session)
        return session

    def _log_refused(self, name: str, session: str) -> None:
        """A warning, once per client name, that the name was not used (MAX_NAMES_LOGGED
        names remembered)."""
        if name in self.logged_names:
            return
        if len(self.logged_names) >= MAX_NAMES_LOGGED:
            self.logged_names.clear()
        self.logged_names.add(name)
        log.warning("shadow_session %r is not a name the shadow's routes can take "
                    "([A-Za-z0-9._:-]{1,128}): its requests are followed as %r (or the "
                    "session their prompt extends); this is logged once per name",
                    name[:200], session)

    def match(self, prompt: Sequence[int]) -> str | None:
        """The session this prompt continues (module doc): its first difference from the
        session's ids lies in that session's last page and past half its ids (a session of
        less than a page is not matched by a shared first id alone), and no running request
        extends it; of those, the one holding most ids, the most recently used first."""
        busy = set(self.sessions.values())
        best, best_len = None, 0
        reader = self.door.reader
        for sid in reader.sessions():
            if sid in busy:
                continue
            num_ids = reader.position(sid)[0]
            if num_ids <= best_len:
                continue
            need = max((num_ids - 1) // self.grid * self.grid, (num_ids + 1) // 2)
            if len(prompt) >= need and reader.held_starts_with(sid, prompt[:need]):
                best, best_len = sid, num_ids
        return best
