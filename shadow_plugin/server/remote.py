"""A door (server.routes) to a shadow that lives in another process: an engine's worker, reached
by a call `call(name, kwargs) -> reply` (vLLM: a collective RPC). The worker side answers with
`serve_call`, which runs the facade's method and packs the shadow's errors so that this side
raises them again as the same types (a route answers 404, 400 or 503 as in the standalone
service). Waiting for the reader (`wait`) runs here, one look per call, so the engine never
waits on a client. A door that can receive pushed replies (server.result_box) gets a
question's reply when it is ready (`call_pushed`), looking only now and then as a safety net.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from shadow_plugin.chat.questions import Answer
from shadow_plugin.reader.fork import Generation
from shadow_plugin.server.errors import NotReady, QuestionTooLong
from shadow_plugin.server.result_box import LOOK

# The facade's methods a remote door may call, with the status (no model needed).
CALLS = ("status", "fork_position", "position", "positions", "holds", "not_reading_why",
         "ask", "ask_many", "summarize", "narration", "sessions", "check", "metrics")
# The calls a worker answers by ticket (engine.embedded), whose replies it can push.
TICKETED = ("ask", "ask_many", "summarize", "check")
ERRORS = {"KeyError": KeyError, "ValueError": ValueError, "NotReady": NotReady,
          "QuestionTooLong": QuestionTooLong}
TICKET_POLL_S = 0.02        # the longest wait between two looks for a question's result
FIRST_POLL_S = 0.001        # the first wait: the looks back off from it, doubling, so a
#                             question of a few ms is answered within about its own time
LOOK_EVERY_S = 0.25        # with a pushed reply: the wait between two looks (in case a push
#                            was lost: the box's queue full)
RESULT_WAIT_S = 0.005       # how long a look may wait on the other side for the result (an
#                             engine's loop runs the look: about one chunk of the 0.8B on an
#                             H200; the other side waits only while its host has no requests)

Call = Callable[[str, dict], Any]


def serve_call(service, name: str, kwargs: dict, extra_status: dict | None = None):
    """Run call `name` on a server.service.Service (its status, or its facade's method) and
    return ("ok", result) or ("error", type name, args) for the shadow's errors (KeyError,
    ValueError, NotReady, QuestionTooLong); other exceptions propagate. ValueError for an
    unknown call."""
    if name not in CALLS:
        return ("error", "ValueError", (f"unknown call {name!r} (known: {', '.join(CALLS)})",))
    try:
        if name == "status":
            return ("ok", {**service.status(), **(extra_status or {})})
        return ("ok", plain(getattr(service.require(), name)(**kwargs)))
    except NotReady as e:
        return ("error", "NotReady", (e.why, e.failed))
    except QuestionTooLong as e:                       # 413 on this side too
        return ("error", "QuestionTooLong", e.args)
    except (KeyError, ValueError) as e:                # subclasses travel as their base
        return ("error", "KeyError" if isinstance(e, KeyError) else "ValueError", e.args)


def plain(result):
    """The result as plain data (dataclasses as dicts, tuples as lists): what an engine's RPC
    carries (vLLM's serialises replies with msgpack)."""
    if dataclasses.is_dataclass(result):
        return dataclasses.asdict(result)
    if isinstance(result, (tuple, list)):
        return [plain(x) for x in result]
    return result


def unpack(reply):
    """The result of a serve_call reply, or its error raised again."""
    if reply[0] == "ok":
        return reply[1]
    raise ERRORS[reply[1]](*reply[2])


def run(call: Call, name: str, kwargs: dict, poll_s: float = TICKET_POLL_S,
        first_poll_s: float = FIRST_POLL_S, result_wait_s: float = RESULT_WAIT_S):
    """call(name, kwargs)'s result; a ("ticket", n) reply (a question the other side answers
    in its own thread) is looked for with `result` until it is ready. Each look may wait up to
    result_wait_s (s) on the other side, which answers ("pending", True) when it waited (its
    host idle: the next look goes at once, so the answer comes back within a look of its
    end) and ("pending", False) when it could not (its host busy: the looks here wait,
    doubling from first_poll_s up to poll_s)."""
    reply = call(name, kwargs)
    while reply[0] == "ticket":
        reply = _look(call, reply[1], poll_s, first_poll_s, result_wait_s)
    return unpack(reply)


def _look(call: Call, ticket, poll_s: float = TICKET_POLL_S, first_poll_s: float = FIRST_POLL_S,
          result_wait_s: float = RESULT_WAIT_S):
    """The reply of question `ticket`, looked for until it is ready (run's looks)."""
    wait_s = min(first_poll_s, poll_s)
    while True:
        reply = call("result", {"ticket": ticket, "wait_s": result_wait_s})
        if reply[0] != "pending":
            return reply
        if not reply[1]:
            time.sleep(wait_s)
            wait_s = min(2 * wait_s, poll_s)


def call_pushed(call: Call, box, name: str, kwargs: dict, look_every_s: float = LOOK_EVERY_S):
    """call(name, kwargs) where `box` (a server.result_box.ResultBox, or None) receives the
    reply of a ticketed call when the other side pushes it: the final reply (never a ticket)
    for such a call, waiting for the push, with a look (`result`, no wait on the other side)
    every look_every_s (s) in case the push was lost, and one at once when the other side
    pushes LOOK (the reply could not be pushed, or the question failed). A ticket that says
    the other side cannot push (("ticket", n, False): the box is not on its machine) is looked
    for as `run` does. Other calls, or no box, or a box that cannot receive: call(name,
    kwargs) as it is (a ticket is then run's to look for)."""
    key = box.expect() if box is not None and name in TICKETED else None
    if key is None:
        return call(name, kwargs)
    try:
        reply = call(name, {**kwargs, "reply_to": box.reply_to(key)})
        if reply[0] != "ticket":
            return reply
        if len(reply) > 2 and not reply[2]:         # nothing will be pushed
            reply = _look(call, reply[1])
            box.count("looked")
            return reply
        while True:
            pushed = box.wait(key, look_every_s)
            if pushed is not None and pushed != list(LOOK):     # JSON: a list
                box.count("pushed")
                return pushed
            look = call("result", {"ticket": reply[1], "wait_s": 0})
            if look[0] != "pending":
                box.count("looked")
                return look
    finally:
        box.forget(key)


class RemoteService:
    """The door's `status` and `require` over `call`."""

    def __init__(self, call: Call):
        self._call = call
        self._grid: list[int] = []            # the shadow's grid, once a status gave it

    def status(self) -> dict:
        out = run(self._call, "status", {})
        if not self._grid and out.get("grid"):
            self._grid.append(out["grid"])
        return out

    def require(self) -> "RemoteShadow":
        return RemoteShadow(self._call, lambda: self._grid[0] if self._grid else
                            self.status()["grid"])


class RemoteShadow:
    """The facade's question methods (server.facade.Shadow) over `call`; `grid()` gives the
    shadow's grid (kept by the RemoteService, asked for once)."""

    def __init__(self, call: Call, grid: Callable[[], int]):
        self._call, self._grid = call, grid

    def _run(self, name: str, **kwargs):
        return run(self._call, name, kwargs)

    @property
    def grid(self) -> int:
        return self._grid()                    # a status call the first time only

    def fork_position(self, session: str, at: int | None) -> int:
        return self._run("fork_position", session=session, at=at)

    def positions(self, sessions: list[str]) -> dict:
        """{session: [ids held, C] or None}, as the facade's (facade.Shadow.positions)."""
        return self._run("positions", sessions=list(sessions))

    def not_reading_why(self, session: str | None = None) -> str:
        return self._run("not_reading_why", session=session)

    def ask(self, session: str, question, choices, at: int | None, fork_at: int | None,
            cancelled=None) -> Answer:
        """The worker's answer (a client that leaves stops the wait for it here; the question
        itself, once in the worker, runs to its end)."""
        d = self._run("ask", session=session, question=question, choices=choices, at=at,
                      fork_at=fork_at)
        return Answer(**{**d, "probs": tuple(d["probs"])})

    def ask_many(self, session: str, items: list, at: int | None, fork_at: int | None,
                 cancelled=None) -> list[Answer]:
        """The worker's answers, in order (facade.Shadow.ask_many)."""
        out = self._run("ask_many", session=session, items=[list(x) for x in items], at=at,
                        fork_at=fork_at)
        return [Answer(**{**d, "probs": tuple(d["probs"])}) for d in out]

    def summarize(self, session: str, instruction: str, max_tokens: int,
                  at: int | None, cancelled=None) -> tuple[str, Generation]:
        text, g = self._run("summarize", session=session, instruction=instruction,
                            max_tokens=max_tokens, at=at)
        return text, Generation(**{**g, "ids": tuple(g["ids"])})

    def narration(self, session: str) -> dict:
        return self._run("narration", session=session)

    def sessions(self) -> dict:
        return self._run("sessions")

    def check(self, session: str, cancelled=None) -> dict:
        """The worker's report (facade.Shadow.check; a client that leaves stops the wait for
        it here, the check itself runs to its end in the worker)."""
        return self._run("check", session=session)
