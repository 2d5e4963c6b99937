"""Which sessions hold device memory: the resident cap, LRU spill to disk, exact restore.

Resident bytes (`resident_bytes`): the pages sessions reference (a shared page once), the GDN
table's entries and each resident session's GDN states. Past the cap unreferenced GDN entries
go first, least recently used first; then the least recently used session other than the one
in use is parked:
written to `disk_dir` (files.write_session) or, without a disk, dropped (its ids stay; it is read
again from 0 when used), its pages and entries given back to the page store (cached there,
findable by key, until reused). Files older than the TTL are deleted, and past `disk_bytes` the
oldest
go first. A refused file is moved to `disk_dir/refused/`, counted and logged.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import files
from .kv_pool import write_pages
from .layout import pack
from .pages import PageStore
from .session import Checkpoint, SessionState, kv_view, new_state, release_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreConfig:
    """resident_bytes: the cap on resident session bytes; disk_dir: where parked sessions go
    (None: dropped instead); disk_bytes: cap on the folder's session files (None: no cap);
    disk_ttl_s: files older than this are deleted (48 h, as the seed's engine); gdn_bytes:
    what unreferenced GDN table entries may keep (None: a quarter of resident_bytes)."""

    resident_bytes: int = 4 * 2**30
    disk_dir: Path | None = None
    disk_bytes: int | None = None
    disk_ttl_s: float = 48 * 3600
    gdn_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.resident_bytes < 0:
            raise ValueError(f"resident_bytes must be >= 0, got {self.resident_bytes}")
        if self.gdn_bytes is None:
            object.__setattr__(self, "gdn_bytes", self.resident_bytes // 4)
        if self.gdn_bytes < 0:
            raise ValueError(f"gdn_bytes must be >= 0, got {self.gdn_bytes}")
        if self.disk_dir is not None:
            object.__setattr__(self, "disk_dir", Path(self.disk_dir).expanduser())


@dataclass
class Parked:
    """A session that holds no device memory: its ids (int64), and its file when written."""

    ids: np.ndarray
    path: Path | None
    pending_lines: dict[int, bool]
    committed_on_disk: int = 0


@dataclass
class Counters:
    spills: int = 0
    drops: int = 0
    restores: int = 0
    refusals: int = 0
    refusal_reasons: dict[str, int] = field(default_factory=dict)
    deleted_files: int = 0
    write_errors: int = 0


class Residency:
    """Parks and restores sessions for a reader. Holds only the parked records and counters;
    the resident sessions dict is passed in by the session table (table.SessionTable) on every
    call."""

    def __init__(self, cfg: StoreConfig, store: PageStore, ident: files.FileIdentity):
        self.cfg, self.store, self.spec, self.ident = cfg, store, store.spec, ident
        self.parked: dict[str, Parked] = {}
        self.counters = Counters()
        if cfg.disk_dir is not None:
            cfg.disk_dir.mkdir(parents=True, exist_ok=True)
            for tmp in cfg.disk_dir.glob(".*.tmp"):        # a writer that died mid-write
                tmp.unlink(missing_ok=True)
            self.sweep()
            self._adopt()

    def _adopt(self) -> None:
        """List the sessions an earlier process parked here (stats shows them as on disk)."""
        for path in sorted(self.cfg.disk_dir.glob("*" + files.SUFFIX)):
            self._adopt_file(path)

    def _adopt_file(self, path: Path) -> Parked | None:
        """Record a file this reader could load (its header and ids read, its state left on
        disk) as a parked session; None for a file of another model, grid or format."""
        found = files.peek(path, self.ident)
        if found is None or path.name != files.file_name(found[0]):
            return None
        sid, ids, committed = found
        self.parked[sid] = Parked(ids, path, {}, committed)
        return self.parked[sid]

    def record(self, sid: str) -> Parked | None:
        """The parked record of `sid`, adopting its file when one appeared on disk since this
        reader started (another process sharing the folder); None when there is none this
        reader could load. Restores nothing."""
        rec = self.parked.get(sid)
        if rec is None:
            path = self._disk_path(sid)
            rec = self._adopt_file(path) if path is not None else None
        return rec

    # -- parking --------------------------------------------------------------------------------
    def resident_bytes(self, sessions: dict[str, SessionState]) -> int:
        """Referenced pages (each once), GDN table entries, the sessions' GDN states."""
        s = self.store
        live = sum(c.nbytes + r.nbytes for st in sessions.values() for c, r in st.gdn)
        return s.manager.num_pinned * s.pool.page_bytes + s.gdn.nbytes + live

    def make_room(self, sessions: dict[str, SessionState], keep: str | None) -> None:
        """Keep unreferenced GDN entries within their budget; then, past the cap, drop
        unreferenced entries and park least recently used sessions other than `keep`."""
        gdn, cap = self.store.gdn, self.cfg.resident_bytes
        gdn.evict()
        self._evict_over(sessions)
        while self.resident_bytes(sessions) > cap:
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
        if self.cfg.disk_dir is not None:   # also at C = 0: its ids outlive a restart
            try:
                packed = pack(self.spec, kv_view(self.store, st).gather(st.committed), st.gdn,
                              st.committed)
                path, _ = files.write_session(self.cfg.disk_dir, sid, st, packed, self.ident)
            except OSError as e:             # disk full, folder gone: dropped, ids kept
                log.warning("could not write session %r (%s): dropped, its ids kept", sid, e)
                self.counters.write_errors += 1
        if path is not None:
            self.counters.spills += 1
            self.sweep(keep=path)
        else:
            self.counters.drops += 1
        self.parked[sid] = Parked(files.ids_array(st.ids), path, dict(st.pending_lines),
                                  st.committed if path else 0)
        release_state(self.store, st)

    def close(self, sessions: dict[str, SessionState]) -> None:
        """A planned stop: write every resident session (when there is a disk)."""
        for sid in list(sessions):
            self.park(sessions, sid)

    # -- restoring ------------------------------------------------------------------------------
    def knows(self, sid: str) -> bool:
        return sid in self.parked or self._disk_path(sid) is not None

    def _disk_path(self, sid: str) -> Path | None:
        if self.cfg.disk_dir is None:
            return None
        path = self.cfg.disk_dir / files.file_name(sid)
        return path if path.is_file() else None

    def restore(self, sid: str) -> SessionState | None:
        """The parked (or on-disk, from an earlier process) session `sid`, back on the device;
        None when it is unknown. A refused file is set aside and the session starts again
        from 0 with its ids (when they are known)."""
        rec = self.parked.pop(sid, None)
        path = rec.path if rec else self._disk_path(sid)
        if path is not None and path.is_file():
            try:
                loaded = files.read_session(path, sid, self.ident, self.spec)
                if rec is not None and not np.array_equal(np.asarray(loaded.ids), rec.ids):
                    raise files.RefusedFile("ids", "the file's ids differ from the session's")
                self.counters.restores += 1
                return self._load(loaded)
            except files.RefusedFile as e:
                self._refuse(path, e)
        if rec is None:
            return None
        st = new_state(self.spec)
        st.ids = rec.ids.tolist()
        st.pending_lines = {p: e for p, e in rec.pending_lines.items() if p > 0}
        return st

    def _load(self, loaded: files.Loaded) -> SessionState:
        """A resident state from a file's content: pages held already (by key) are taken,
        the others allocated and written; checkpoints become GDN table entries."""
        store, g = self.store, self.store.grid
        st = new_state(self.spec)
        st.ids, st.gdn = loaded.ids, loaded.gdn
        new: list[int] = []                      # page numbers to write from the file
        for i in range(loaded.committed // g):
            ids = loaded.ids[i * g:(i + 1) * g]
            key = store.key_after(st.keys, ids)
            page = store.manager.lookup(key, ids)
            if page is not None:
                store.manager.take(page)
            else:
                page = store.manager.name(store.allocate(), key, ids)
                new.append(i)
            st.pages.append(page)
            st.keys.append(key)
        if new:
            sel = torch.tensor(new)
            write_pages(store.pool, [st.pages[i].index for i in new],
                        [(k.view(-1, g, *k.shape[1:])[sel].flatten(0, 1),
                          v.view(-1, g, *v.shape[1:])[sel].flatten(0, 1))
                         for k, v in loaded.kv_rows])
        st.committed = st.furthest = loaded.committed
        for pos, gdn, episode, kept in loaded.checkpoints:
            entry = store.gdn.put(st.keys[pos // g - 1], pos, gdn,
                                  "shared" if kept else "checkpoint")
            st.checkpoints.append(Checkpoint(pos, entry, episode, kept))
        st.pending_lines, st.shared_line = loaded.pending_lines, loaded.shared_line
        return st

    def _refuse(self, path: Path, e: files.RefusedFile) -> None:
        log.warning("refused session file %s: %s", path.name, e)
        c = self.counters
        c.refusals += 1
        c.refusal_reasons[e.reason] = c.refusal_reasons.get(e.reason, 0) + 1
        aside = path.parent / "refused"
        aside.mkdir(exist_ok=True)
        path.replace(aside / f"{path.stem}.{e.reason}.{int(time.time())}{path.suffix}")

    def forget(self, sid: str) -> None:
        """Drop a session's record and file."""
        rec = self.parked.pop(sid, None)
        path = rec.path if rec else self._disk_path(sid)
        if path is not None:
            path.unlink(missing_ok=True)

    # -- the disk -------------------------------------------------------------------------------
    def sweep(self, keep: Path | None = None) -> None:
        """Delete files past the TTL, then the oldest past disk_bytes (never `keep`)."""
        d = self.cfg.disk_dir
        if d is None:
            return
        now = time.time()
        paths = sorted(d.glob("*" + files.SUFFIX), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in paths)
        for p in paths:
            expired = now - p.stat().st_mtime > self.cfg.disk_ttl_s
            over = self.cfg.disk_bytes is not None and total > self.cfg.disk_bytes
            if p != keep and (expired or over):
                total -= p.stat().st_size
                p.unlink(missing_ok=True)
                self.counters.deleted_files += 1
                self._unlink_record(p)

    def _unlink_record(self, path: Path) -> None:
        for rec in self.parked.values():
            if rec.path == path:
                rec.path, rec.committed_on_disk = None, 0

    def disk_usage_bytes(self) -> int:
        d = self.cfg.disk_dir
        return sum(p.stat().st_size for p in d.glob("*" + files.SUFFIX)) if d else 0
