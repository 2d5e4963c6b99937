"""Questions that wait for the reader (`"wait": true`), in the event loop: a waiting ask holds no
thread, no worker slot and no lock. One poller task looks at the positions of every waited
session every poll_s in a single call (one worker thread, one hold of the service's lock, or
one call to an engine's worker) and wakes the asks whose line C has reached; each ask ends at
its timeout (WaitTimeout, 504 with the backlog) or when its client disconnects (ClientGone).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable

from starlette.concurrency import run_in_threadpool

from shadow_plugin import validate
from shadow_plugin.server.errors import ClientGone, WaitTimeout

POLL_S = 0.05               # how often the poller looks at the waited sessions' C
DISCONNECT_POLL_S = 0.25    # how often a waiting ask looks whether its client left
WHY_FRESH_S = 0.1           # asks on one session timing out together share one look at why
#                             (one lock hold, one call to an engine's worker); short, so a
#                             reason is never older than what it explains by much


@dataclass(eq=False)
class Waiter:
    """One waiting ask: its session, `at` (None: all its ids), the future the poller sets, the
    last (ids held, C) seen (None before the poller's first look)."""

    session: str
    at: int | None
    done: asyncio.Future
    seen: list[int] | None = None


class Waits:
    """Args: door (server.routes' door: `require()` gives the shadow, whose `positions(sessions)`
    answers {session: [ids held, C] or None} and `not_reading_why(session)` the reason for a
    504, and whose `grid` is G); poll_s."""

    def __init__(self, door, poll_s: float = POLL_S):
        self.door, self.poll_s = door, poll_s
        self._waiters: set[Waiter] = set()
        self._task: asyncio.Task | None = None
        self._why: dict[str, tuple[float, str]] = {}     # session -> (loop time, text)
        self._why_lock: asyncio.Lock | None = None

    async def wait(self, session: str, at: int | None, timeout_s: float,
                   disconnected: Callable[[], Awaitable[bool]] | None = None) -> None:
        """Return once the session's C reaches the grid line at or below `at` (looked at once
        more at the end of timeout_s). Raises WaitTimeout after timeout_s (with the backlog
        and C held then and why the reader has not read them), KeyError when the session goes
        away, ValueError when it no longer holds `at` ids (rewritten shorter), ClientGone
        when `disconnected()` says so."""
        loop = asyncio.get_running_loop()
        w = Waiter(session, at, loop.create_future())
        self._waiters.add(w)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._poll())
        deadline = loop.time() + timeout_s
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    error = await self._timeout(w, timeout_s)
                    if error is None:
                        return None
                    raise error
                try:
                    await asyncio.wait_for(asyncio.shield(w.done), min(left, DISCONNECT_POLL_S))
                    return w.done.result()
                except asyncio.TimeoutError:
                    if disconnected is not None and await disconnected():
                        raise ClientGone() from None
        finally:
            self._waiters.discard(w)
            if w.done.done() and not w.done.cancelled():
                w.done.exception()                    # seen: no "never retrieved" warning

    async def _timeout(self, w: Waiter, timeout_s: float) -> Exception | None:
        """At the end of a wait: None when the session's C has reached its line after all
        (looked at now: the poller may not have looked since, or at all with a tiny
        timeout_s); else the 504 with the session's position as held now, how many ids it
        still had to read, and why they were not read (KeyError: the session went)."""
        shadow = self.door.require()
        seen, grid = await run_in_threadpool(lambda: (shadow.positions([w.session]),
                                                      shadow.grid))
        pos = seen.get(w.session)
        if pos is None:
            return KeyError(f"unknown session {w.session!r}")
        w.seen = list(pos)
        n, c = pos
        if (outside := _outside(w, n)) is not None:
            return outside
        if c >= (n if w.at is None else w.at) // grid * grid:
            return None
        why = await self._not_reading_why(w.session)
        return WaitTimeout(n - c, c, f"{n - c} ids were still unread after the {timeout_s} s "
                           f"waited (timeout_s); {why}")

    async def _not_reading_why(self, session: str) -> str:
        """Why the reader has not read the session's ids, looked at once for the asks on it
        that time out within WHY_FRESH_S of each other."""
        loop = asyncio.get_running_loop()
        if self._why_lock is None:
            self._why_lock = asyncio.Lock()
        async with self._why_lock:
            seen = self._why.get(session)
            if seen is None or loop.time() - seen[0] > WHY_FRESH_S:
                text = await run_in_threadpool(self.door.require().not_reading_why, session)
                seen = self._why[session] = (loop.time(), text)
                for s in [s for s, (t, _) in self._why.items() if loop.time() - t > WHY_FRESH_S]:
                    del self._why[s]
            return seen[1]

    async def _poll(self) -> None:
        """While asks wait: one look at all their sessions, then wake those that are done."""
        while self._waiters:
            waiting = [w for w in self._waiters if not w.done.done()]
            sessions = sorted({w.session for w in waiting})
            try:
                shadow = self.door.require()
                # both in a worker thread: a remote door's first look at G is a call that
                # must not run on the event loop's own thread
                seen, grid = await run_in_threadpool(_look, shadow, sessions)
            except Exception as e:                    # the shadow went away: every wait ends
                for w in waiting:
                    if not w.done.done():
                        w.done.set_exception(e)
                await asyncio.sleep(self.poll_s)
                continue
            for w in waiting:
                pos = seen.get(w.session)
                if w.done.done():
                    continue
                if pos is None:
                    w.done.set_exception(KeyError(f"unknown session {w.session!r}"))
                    continue
                if isinstance(pos, Exception):        # this session's own error
                    w.done.set_exception(pos)
                    continue
                w.seen = list(pos)
                n, c = pos
                if (outside := _outside(w, n)) is not None:     # the session was cut
                    w.done.set_exception(outside)
                elif c >= (n if w.at is None else w.at) // grid * grid:
                    w.done.set_result(None)
            await asyncio.sleep(self.poll_s)


def _outside(w: Waiter, num_ids: int) -> ValueError | None:
    """The 400 of an ask whose `at` is past the session's ids now (a turn rewrote it shorter
    while the ask waited): what the ask itself would raise (Shadow.fork_position), at once
    rather than a 504 at the wait's end; None otherwise."""
    if w.at is not None:
        try:
            validate.position(w.at, num_ids)
        except ValueError as e:
            return e
    return None


def _look(shadow, sessions: list[str]) -> tuple[dict, int]:
    """(shadow.positions(sessions), shadow.grid), in one positions call; when that call raises
    for several sessions, each is looked at alone, so one session's error (a data-parallel
    door's 503 for a session only a loading rank may hold) ends only its own waits: its entry
    is then the exception."""
    grid = shadow.grid
    if not sessions:
        return {}, grid
    try:
        return shadow.positions(sessions), grid
    except Exception:
        if len(sessions) < 2:
            raise
    seen: dict = {}
    for s in sessions:
        try:
            seen.update(shadow.positions([s]))
        except Exception as e:
            seen[s] = e
    return seen, grid
