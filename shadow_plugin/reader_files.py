"""The reader's calls about what a restart finds on disk: a session's manifest written at a
turn's end (`save`), marked stale before outputs (`mark_outputs`), and whether a session came
back stale (`stale`). A base class of reader.Reader, whose session table it uses (`table`,
`_get`).
"""
from __future__ import annotations

from . import validate


class FileCalls:
    """Manifests and staleness (mixed into reader.Reader)."""

    def mark_outputs(self, session: str) -> bool | None:
        """Before the first outputs since the session's manifest was written, write it again
        marked stale (one write a turn), so a restart that finds it knows outputs came after
        it. Returns True when the disk's manifest says so (now or already), False when the
        write failed (logged, counted), None without a disk. Raises KeyError when unknown."""
        st = self._get(session)
        disk = self.table.store.disk
        if disk is None:
            return None
        if st.unsaved_outputs and disk.manifest_path(session).is_file():   # one stat: the
            return True                   # TTL may have swept an idle session's manifest
        return self.table.save(session, stale=True)

    def stale(self, session: str) -> bool:
        """Whether the session came back from a restart holding a prefix of what the host sent
        (until the host's next prompt), restoring nothing. KeyError when unknown."""
        st = self.table.resident.get(validate.session_id(session))
        if st is not None:
            return st.stale
        rec = self.table.residency.record(session)
        if rec is None:
            raise self.table.unknown(session)
        return rec.stale

    def refresh_disk_listing(self) -> None:
        """List the disk folder for its counts when due (DiskStore.refresh), outside the
        reader's lock, so stats() under it does not list a large folder; nothing without a
        disk."""
        if self.table.store.disk is not None:
            self.table.store.disk.refresh()

    def refused(self, session: str) -> str | None:
        """Why the session's manifest was refused when the reader started (it is listed in
        stats()["refused_sessions"] until dropped or started again), None when it was not."""
        return self.table.residency.refused(validate.session_id(session))

    def save(self, session: str) -> bool:
        """Write the resident session's manifest (its ids, C, page and state keys,
        checkpoints) to the disk now, when the reader has one (a turn's end; a prompt writes
        its own): a restart resumes it at the deepest line whose pages and states are on disk.
        Returns whether the disk's manifest now holds all its ids: False without a disk or
        when the write failed (logged, counted in stats()["write_errors"]); for a parked
        session, whether its park wrote it. Raises ValueError for a bad session id, KeyError
        for an unknown one."""
        if not self.table.knows(validate.session_id(session)):
            raise KeyError(f"unknown session {session!r}")
        return self.table.save(session)
