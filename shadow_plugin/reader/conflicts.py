"""Requests that do not fit what a session holds (the HTTP service answers 409): outputs for a
session that came back stale from a crash, and outputs sent at another position than the ids
held. The host re-synchronises by sending the session's turn again (its whole prompt)."""
from __future__ import annotations


class Conflict(Exception):
    """A request that does not fit the session as held (409)."""


class StaleSession(Conflict):
    """Outputs for a session restored from a manifest written before outputs that were lost:
    it holds `position` ids, a prefix of what the host sent."""

    def __init__(self, session: str, position: int):
        self.session, self.position = session, position
        super().__init__(f"session {session!r} is stale: a restart found it holding {position} "
                         f"ids, outputs sent after them were lost; send its turn again (the "
                         f"whole prompt) to re-synchronise it")


class PositionMismatch(Conflict):
    """Outputs sent as following `position` ids when the session holds `held`."""

    def __init__(self, session: str, position: int, held: int):
        self.session, self.position, self.held = session, position, held
        super().__init__(f"session {session!r}: these outputs follow position {position} but "
                         f"the session holds {held} ids; send its turn again (the whole prompt) "
                         f"to re-synchronise it")
