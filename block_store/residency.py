"""Which sessions hold device memory: the resident cap, LRU spill to disk, exact restore.

Resident bytes (`resident_bytes`): the pages sessions reference (a shared page once), the GDN
table's entries and each resident session's GDN states. Past the cap unreferenced GDN entries
go first, least recently used first; then the least recently used session other than the one
in use is parked: its pages, its states at C and its checkpoints' entries written to the disk
tier (disk.DiskStore, by key: what is on disk already is not written again) and then its
manifest (disk_io.save_session); without a disk, or when the write fails, it is dropped (its
ids stay). Either way its pages and entries go back to the page store, cached and findable by
key until reused (with a disk, written first: spill.Spill), and its states at C stay there as an
unreferenced entry (handed over, not copied), so a restore soon after finds them in memory. A
restore resumes the session's ids through the one lookup (checkpoints.resume: memory, then
disk), so it lands at the deepest line still held. The disk keeps its TTL and byte cap
(DiskStore.sweep); a refused file is set aside under disk_dir/refused/, counted and logged.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from block_store.checkpoints import resume
from block_store.disk import files
from block_store.disk.manifest import Superseded, peek_mark, peek_session
from block_store.disk.store import DiskStore, Manifest
from block_store.disk_io import line_on_disk, load_checkpoints, manifest_of, save_session
from block_store.pages import PageStore
from block_store.session import SessionState, new_state, release_state

log = logging.getLogger(__name__)
SWEEP_EVERY_S = 60.0      # the TTL is applied at least this often while sessions are parked


@dataclass(frozen=True)
class StoreConfig:
    """resident_bytes: the cap on resident session bytes; disk_dir: where parked sessions go
    (None: dropped instead); disk_bytes: cap on the folder's files, pages, GDN entries and
    manifests (None: no cap);
    disk_ttl_s: files older than this are deleted (48 h, as the seed's engine); gdn_bytes:
    what unreferenced GDN table entries may keep (None: a quarter of resident_bytes);
    disk_shared: other servers use the folder too (several servers on one folder): every
    manifest write also writes the pages and states the disk lacks, a caught-up session is
    written, and a host's event first looks for a newer manifest on disk (Residency.sync);
    disk_grace_s: files written or used within this many seconds are never deleted by the
    TTL or the cap (another process may be about to read them; None: 60 s with disk_shared,
    else 0); prefetch_bytes: what page rows read ahead of a restore, outside the reader's lock,
    may hold in host memory (disk.prefetch; None: half of resident_bytes, at most 2 GiB: a
    100k-id session of the 0.8B is about 1.2 GB; 0: no read-ahead)."""

    resident_bytes: int = 4 * 2**30
    disk_dir: Path | None = None
    disk_bytes: int | None = None
    disk_ttl_s: float = 48 * 3600
    gdn_bytes: int | None = None
    disk_shared: bool = False
    disk_grace_s: float | None = None
    prefetch_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.resident_bytes < 0:
            raise ValueError(f"resident_bytes must be >= 0, got {self.resident_bytes}")
        if self.gdn_bytes is None:
            object.__setattr__(self, "gdn_bytes", self.resident_bytes // 4)
        if self.gdn_bytes < 0:
            raise ValueError(f"gdn_bytes must be >= 0, got {self.gdn_bytes}")
        if self.disk_grace_s is None:
            object.__setattr__(self, "disk_grace_s", 60.0 if self.disk_shared else 0.0)
        if not self.disk_grace_s >= 0:
            raise ValueError(f"disk_grace_s must be >= 0 s, got {self.disk_grace_s}")
        if self.disk_dir is not None:
            object.__setattr__(self, "disk_dir", Path(self.disk_dir).expanduser())
        if self.prefetch_bytes is None:
            object.__setattr__(self, "prefetch_bytes", min(self.resident_bytes // 2, 2**31))
        if self.prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes must be >= 0, got {self.prefetch_bytes}")


@dataclass
class Parked:
    """A session that holds no device memory: its ids (int64), its manifest when written (None:
    dropped), the C its manifest holds (after a restart lowered to the deepest line whose
    files are there and whole, disk_io.line_on_disk: what a restore finds unless a checksum
    fails), the furthest C it had committed, (dropped only) its
    pending lines and shared line, the session's flags (session.SessionState), the
    version of its manifest (Manifest.mark) when written or adopted, and the keys of its
    pages [0, C) as it was parked or as its manifest names them (16 bytes each: what status
    looks up in memory and in the disk's listing, block_store.warmth)."""

    ids: np.ndarray
    manifest: Path | None
    committed_on_disk: int = 0
    furthest: int = 0
    pending_lines: dict[int, bool] = field(default_factory=dict)
    shared_line: int = 0
    stale: bool = False
    unsaved_outputs: bool = False
    mark: tuple[str, int] | None = None
    keys: list[bytes] = field(default_factory=list)


@dataclass
class Counters:
    spills: int = 0
    drops: int = 0
    restores: int = 0
    deleted_files: int = 0
    write_errors: int = 0
    superseded: int = 0
    restore_ms: float = 0.0      # wall time of the restores (manifest read, pages and states)


class Extras(Protocol):
    """Memory a reader holds beside its sessions that counts against the cap and goes first
    past it (a reader's questions' tails, shadow_plugin.reader.tails): its pages are
    referenced pages (counted as such), state_bytes() the rest it holds (bytes);
    give_up(store) gives up its least valuable part, False when nothing is left."""

    def state_bytes(self) -> int: ...
    def give_up(self, store: PageStore) -> bool: ...


class Residency:
    """Parks and restores sessions for a reader. Holds only the parked records and counters;
    the resident sessions dict is passed in by the session table (table.SessionTable) on every
    call. `store.disk` is the disk tier (None without disk_dir). extras (None: none): what
    the reader holds beside its sessions (Extras), counted in resident_bytes and given up
    past the cap before any session is parked."""

    def __init__(self, cfg: StoreConfig, store: PageStore, extras: Extras | None = None):
        self.cfg, self.store, self.spec = cfg, store, store.spec
        self.extras = extras
        self.disk: DiskStore | None = store.disk
        self.parked: dict[str, Parked] = {}
        # manifests refused at start-up: path -> (the session they name, if readable, reason)
        self.unusable: dict[Path, tuple[str | None, str]] = {}
        self.counters = Counters()
        self._swept_at = 0.0
        if self.disk is not None:
            self.sweep()
            seen: dict[Path, bool] = {}
            for path in self.disk.manifests():     # what an earlier process parked here
                rec = self._adopt(path)
                if rec is not None:                # C as far as its files are there, whole
                    rec.committed_on_disk = line_on_disk(self.store, rec.ids,
                                                         rec.committed_on_disk, seen)

    def _adopt(self, path: Path, refuse: bool = False) -> Parked | None:
        """Record a manifest this reader could use (its ids read, its pages left on disk) as
        a parked session; None for a manifest that does not fit: left alone (another reader
        on the folder may use it), or with `refuse` (its session was asked for) set aside."""
        try:
            sid, m = self.disk.read_manifest_file(path)
        except files.RefusedFile as e:
            if refuse:
                log.warning("refused manifest %s: %s", path.name, e)
                self.disk.set_aside(e.path or path, e.reason, counted=path in self.unusable)
            elif path not in self.unusable:  # listed (status) until its session is deleted
                why = str(e) if str(e).startswith(e.reason) else f"{e.reason}: {e}"
                self.unusable[path] = (peek_session(path), why)
                self.disk.count_refusal(e.reason)      # once, here: left where it is
            return None
        self.parked[sid] = Parked(np.asarray(m.ids, dtype=np.int64), path, m.committed,
                                  m.committed, stale=m.stale, mark=m.mark,
                                  keys=[bytes.fromhex(k) for k in m.page_keys])
        return self.parked[sid]

    def record(self, sid: str) -> Parked | None:
        """The parked record of `sid`, adopting its manifest when one appeared on disk since
        this reader started (another process sharing the folder); None when there is none
        this reader could use. Restores nothing."""
        rec = self.parked.get(sid)
        if rec is None and self.disk is not None:
            path = self.disk.manifest_path(sid)     # a listed one stays, listed, where it is
            rec = self._adopt(path, refuse=path not in self.unusable) if path.is_file() \
                else None
        return rec

    # -- parking --------------------------------------------------------------------------------
    def resident_bytes(self, sessions: dict[str, SessionState]) -> int:
        """Referenced pages (each once), GDN table entries, the sessions' GDN states, the
        extras' other bytes."""
        s = self.store
        live = sum(c.nbytes + r.nbytes for st in sessions.values() for c, r in st.gdn)
        extra = self.extras.state_bytes() if self.extras is not None else 0
        return s.manager.num_pinned * s.pool.page_bytes + s.gdn.nbytes + live + extra

    def make_room(self, sessions: dict[str, SessionState], keep: str | None) -> None:
        """Keep unreferenced GDN entries within their budget; then, past the cap, drop
        unreferenced entries, give up the extras, and park least recently used sessions
        other than `keep`."""
        gdn, cap = self.store.gdn, self.cfg.resident_bytes
        gdn.evict()
        self._evict_over(sessions)
        while self.resident_bytes(sessions) > cap:
            if self.extras is not None and self.extras.give_up(self.store):
                continue
            others = [s for s in sessions if s != keep]
            if not others:
                return
            self.park(sessions, min(others, key=lambda s: sessions[s].last_used))
            self._evict_over(sessions)

    def _evict_over(self, sessions: dict[str, SessionState]) -> None:
        """Drop unreferenced GDN entries, least recently used first, until the resident bytes
        are within the cap or none is left."""
        over = self.resident_bytes(sessions) - self.cfg.resident_bytes
        if over > 0:
            gdn = self.store.gdn
            gdn.evict(max(0, gdn.loose_bytes - over))

    def park(self, sessions: dict[str, SessionState], sid: str) -> None:
        """Move one resident session to disk (or drop its tensors without a disk)."""
        st = sessions.pop(sid)
        path = None
        if self.disk is not None:       # also at C = 0: its ids outlive a restart
            try:
                path = save_session(self.store, self.disk, sid, st)
            except Superseded:         # another process moved it on: the folder's is newer
                self._take_newer(sid, st)
                return
            except Exception as e:     # disk full, folder gone, anything: dropped, ids kept
                log.warning("could not write session %r (%s): dropped, its ids kept", sid, e)
                self.counters.write_errors += 1
        if path is not None:
            self.counters.spills += 1
            self.upkeep(keep={path})
        else:
            self.counters.drops += 1
        self.parked[sid] = Parked(np.asarray(st.ids, dtype=np.int64), path,
                                  st.committed if path else 0, st.furthest,
                                  dict(st.pending_lines), st.shared_line, st.stale,
                                  st.unsaved_outputs and path is None, st.manifest_mark,
                                  list(st.keys))
        self._release(st)

    def _release(self, st: SessionState) -> None:
        """Give back a session's pages and entries; its states at C stay findable as an
        unreferenced entry while memory allows (handed over, not copied)."""
        if st.committed:
            gdn = self.store.gdn
            entry = gdn.put(st.keys[-1], st.committed, st.gdn, "state", owned=True)
            if entry.kind == "tip":      # its ring's newest line: now what a restore needs
                entry.kind = "state"
            gdn.release(entry)
        release_state(self.store, st)

    def _take_newer(self, sid: str, st: SessionState) -> None:
        """Another process wrote session `sid`'s manifest since this one last saw it: its
        resident copy `st` (no longer in the resident sessions) is given back and the folder's
        version becomes the parked record, restored on next use (counted in `superseded`);
        when it does not load, the ids held here stay (dropped)."""
        self.counters.superseded += 1
        log.info("session %r: the folder holds a newer manifest (another server took it on)",
                 sid)
        if self._adopt(self.disk.manifest_path(sid), refuse=True) is None:
            self.parked[sid] = Parked(np.asarray(st.ids, dtype=np.int64), None, 0,
                                      st.furthest, dict(st.pending_lines), st.shared_line,
                                      st.stale, keys=list(st.keys))
        self._release(st)

    def sync(self, sessions: dict[str, SessionState], sid: str) -> bool:
        """With a shared folder (StoreConfig.disk_shared), whether resident session `sid`'s
        manifest on disk is a version this process has not seen (another server wrote it
        since: one header read); then the resident copy is given back and the folder's
        version parked in its place (the next use restores it). False otherwise."""
        st = sessions.get(sid)
        if st is None or self.disk is None or not self.cfg.disk_shared:
            return False
        found = peek_mark(self.disk.manifest_path(sid))
        if found is None or found == st.manifest_mark:
            return False
        del sessions[sid]
        self._take_newer(sid, st)
        return True

    def supersede(self, sessions: dict[str, SessionState], sid: str) -> None:
        """A manifest write of resident session `sid` found a newer version on disk
        (Superseded): its copy is given back and the folder's parked in its place."""
        self._take_newer(sid, sessions.pop(sid))

    def close(self, sessions: dict[str, SessionState]) -> None:
        """A planned stop: write every resident session (when there is a disk)."""
        for sid in list(sessions):
            self.park(sessions, sid)

    def save_manifest(self, sid: str, st: SessionState, stale: bool = False) -> bool:
        """Write the resident session's manifest (a turn's start or end; `stale`: just before
        outputs are appended; its pages are written when it is parked: a restart resumes at the
        deepest line whose pages and states are on disk). Returns whether it was written: False
        without a disk, or when the write failed (logged and counted in write_errors: the
        session in memory is unchanged). With a shared folder (StoreConfig.disk_shared) the
        pages and states the disk lacks are written first (disk_io.save_session), so another
        server resumes the session from them. Raises Superseded when another process wrote the
        session's manifest since this one last saw it (nothing replaced)."""
        if self.disk is None:
            return False
        try:
            if self.cfg.disk_shared:       # its pages and states first, for another server
                save_session(self.store, self.disk, sid, st, stale=stale or st.stale)
            else:
                m = manifest_of(st, stale or st.stale)
                self.disk.write_manifest(sid, m, st.manifest_mark)
                st.manifest_mark = m.mark
            st.unsaved_outputs = stale
            return True
        except Superseded:
            raise
        except Exception as e:
            log.warning("could not write the manifest of session %r (%s)", sid, e)
            self.counters.write_errors += 1
            return False

    # -- restoring ------------------------------------------------------------------------------
    def knows(self, sid: str) -> bool:
        return sid in self.parked or (self.disk is not None and
                                      self.disk.manifest_path(sid).is_file())

    def _manifest(self, sid: str, rec: Parked | None) -> Manifest | None:
        """The session's manifest when it has one this reader can use; a refused one is set
        aside (counted, logged). With a shared folder a version another process wrote since
        the record was made is taken (counted in `superseded`), whatever its ids."""
        if self.disk is None:
            return None
        path = rec.manifest if rec is not None else self.disk.manifest_path(sid)
        if path is None or not path.is_file():
            return None
        try:
            m = self.disk.read_manifest(sid)
            moved = rec is not None and self.cfg.disk_shared and m.mark != rec.mark
            if moved:                    # another server wrote it since: the folder's is newer
                self.counters.superseded += 1
            elif rec is not None and not np.array_equal(np.asarray(m.ids), rec.ids):
                raise files.RefusedFile("ids", "the manifest's ids differ from the session's",
                                        path)
            return m
        except files.RefusedFile as e:
            log.warning("refused manifest of session %r: %s", sid, e)
            self.disk.set_aside(e.path or path, e.reason, counted=path in self.unusable)
            return None

    def restore(self, sid: str) -> SessionState | None:
        """The parked (or on-disk, from an earlier process) session `sid`, resident again:
        its ids, resumed at the deepest line whose pages and states are held (memory, then
        disk), its checkpoints whose entries are found; None when it is unknown. A refused
        manifest is set aside and the session starts again from 0 with its ids (when known).
        Its wall time is counted in `restore_ms`."""
        t0 = time.perf_counter()
        try:
            return self._restore(sid)
        finally:
            self.counters.restore_ms += (time.perf_counter() - t0) * 1000

    def _restore(self, sid: str) -> SessionState | None:
        rec = self.parked.pop(sid, None)
        m = self._manifest(sid, rec)
        if m is None and rec is None:
            return None
        st = new_state(self.spec)
        ids = m.ids if m is not None else rec.ids.tolist()
        resume(self.store, st, ids, 0)
        st.ids, st.furthest = ids, max(rec.furthest if rec else 0,
                                       m.committed if m else 0, st.committed)
        if m is not None:
            load_checkpoints(self.store, st, m)
            st.pending_lines, st.shared_line = m.pending_lines, m.shared_line
            st.stale, st.unsaved_outputs = m.stale, m.stale
            st.manifest_mark = m.mark
        else:
            st.pending_lines, st.shared_line = rec.pending_lines, rec.shared_line
            st.stale, st.unsaved_outputs = rec.stale, rec.unsaved_outputs
        st.pending_lines = {p: e for p, e in st.pending_lines.items() if p > st.committed}
        self.counters.restores += 1
        return st

    def forget(self, sid: str) -> None:
        """Drop a session's record and manifest (its pages stay on disk for other sessions
        until the TTL or the cap deletes them), and its listing as refused."""
        self.parked.pop(sid, None)
        if self.disk is not None:
            path = self.disk.manifest_path(sid)
            path.unlink(missing_ok=True)
            self.unusable.pop(path, None)

    def refused(self, sid: str) -> str | None:
        """Why the session's manifest was refused at start-up (None: it was not)."""
        if self.disk is None:
            return None
        listed = self.unusable.get(self.disk.manifest_path(sid))
        return listed[1] if listed else None

    # -- the disk -------------------------------------------------------------------------------
    def upkeep(self, keep: set[Path] = frozenset()) -> None:
        """Sweep when the folder is past disk_bytes (by DiskStore's counts, which list the
        folder at most every few seconds) or the last sweep is SWEEP_EVERY_S old: a park, or
        a spill of evicted pages (SessionTable.settle), does not list the whole folder."""
        over = self.cfg.disk_bytes is not None and \
            self.disk.counts()["bytes"] > self.cfg.disk_bytes
        if over or time.monotonic() - self._swept_at > SWEEP_EVERY_S:
            self.sweep(keep)

    def sweep(self, keep: set[Path] = frozenset()) -> None:
        """Delete files past the TTL, then past disk_bytes the oldest refused files, pages and
        entries (upkeep.sweep: manifests only by age; never `keep`); a parked session
        whose manifest went keeps its ids in memory (dropped)."""
        if self.disk is None:
            return
        self._swept_at = time.monotonic()
        gone = self.disk.sweep(self.cfg.disk_ttl_s, self.cfg.disk_bytes, keep,
                               self.cfg.disk_grace_s)
        self.counters.deleted_files += len(gone)
        lost = set(gone)
        for rec in self.parked.values():
            if rec.manifest in lost:
                rec.manifest, rec.committed_on_disk = None, 0

    def disk_counts(self) -> dict[str, int]:
        """Files on disk (DiskStore.counts); zeros without a disk."""
        if self.disk is None:
            return {"pages": 0, "gdn_entries": 0, "manifests": 0, "bytes": 0}
        return self.disk.counts()

    def refusals(self) -> dict[str, int]:
        """Files refused since start, by reason: set aside, or (manifests found at start-up)
        left in place and listed in `unusable` (DiskStore.refusals, the one count)."""
        return dict(self.disk.refusals) if self.disk is not None else {}
