"""Which sessions hold device memory: the resident cap, LRU spill to disk, exact restore.

Resident bytes of a session (session.state_bytes): KV capacity x bytes per row, GDN states,
checkpoints. Past the cap the least recently used session other than the one in use is parked:
written to `disk_dir` (files.write_session) or, without a disk, dropped (its ids stay; it is read
again from 0 when used). Files older than the TTL are deleted, and past `disk_bytes` the oldest
go first. A refused file is moved to `disk_dir/refused/`, counted and logged.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import files
from .layout import StateSpec, pack
from .session import SessionState, new_state, state_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreConfig:
    """resident_bytes: the cap on resident session bytes; disk_dir: where parked sessions go
    (None: dropped instead); disk_bytes: cap on the folder's session files (None: no cap);
    disk_ttl_s: files older than this are deleted (48 h, as the seed's engine)."""

    resident_bytes: int = 4 * 2**30
    disk_dir: Path | None = None
    disk_bytes: int | None = None
    disk_ttl_s: float = 48 * 3600

    def __post_init__(self) -> None:
        if self.resident_bytes < 0:
            raise ValueError(f"resident_bytes must be >= 0, got {self.resident_bytes}")
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


class Residency:
    """Parks and restores sessions for a reader. Holds only the parked records and counters;
    the resident sessions dict is passed in by the session table (table.SessionTable) on every
    call."""

    def __init__(self, cfg: StoreConfig, spec: StateSpec, kv_step: int,
                 ident: files.FileIdentity):
        self.cfg, self.spec, self.kv_step, self.ident = cfg, spec, kv_step, ident
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
    def make_room(self, sessions: dict[str, SessionState], keep: str | None) -> None:
        """Park least recently used sessions other than `keep` until the cap holds."""
        total = sum(state_bytes(st) for st in sessions.values())
        while total > self.cfg.resident_bytes:
            others = [s for s in sessions if s != keep]
            if not others:
                return
            victim = min(others, key=lambda s: sessions[s].last_used)
            total -= state_bytes(sessions[victim])
            self.park(sessions, victim)

    def park(self, sessions: dict[str, SessionState], sid: str) -> None:
        """Move one resident session to disk (or drop its tensors without a disk)."""
        st = sessions.pop(sid)
        path = None
        if self.cfg.disk_dir is not None:   # also at C = 0: its ids outlive a restart
            packed = pack(self.spec, st.kv, st.gdn, st.committed)
            path, _ = files.write_session(self.cfg.disk_dir, sid, st, packed, self.ident)
            self.counters.spills += 1
            self.sweep(keep=path)
        else:
            self.counters.drops += 1
        self.parked[sid] = Parked(files.ids_array(st.ids), path, dict(st.pending_lines),
                                  st.committed if path else 0)

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
                st = files.read_session(path, sid, self.ident, self.spec, self.kv_step)
                if rec is not None and not np.array_equal(np.asarray(st.ids), rec.ids):
                    raise files.RefusedFile("ids", "the file's ids differ from the session's")
                self.counters.restores += 1
                return st
            except files.RefusedFile as e:
                self._refuse(path, e)
        if rec is None:
            return None
        st = new_state(self.spec)
        st.ids = rec.ids.tolist()
        st.pending_lines = {p: e for p, e in rec.pending_lines.items() if p > 0}
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
