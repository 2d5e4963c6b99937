"""The sessions one reader holds: resident states (device memory) and parked records (on disk,
or dropped), the LRU clock, the resident cap. The one place a session's memory is looked up,
created, restored, parked and forgotten; the reader decides what to read and keeps the ids valid.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from block_store.disk.files import FileIdentity
from block_store.disk.manifest import Superseded
from block_store.disk.store import DiskStore, writer_token
from block_store.disk_io import prefetch_pages
from block_store.memory.keys import identity_key
from block_store.memory.layout import StateSpec
from block_store.pages import PageStore
from block_store.residency import Extras, Residency, StoreConfig
from block_store.session import SessionState, new_state, release_state, state_bytes
from block_store.warmth import parked, resident


class SessionTable:
    """Args: spec (the states' layouts); cfg (StoreConfig: cap, disk, TTL); ident (what files
    and pages must match, files.FileIdentity: its fields are the root of every page key);
    grid (G, the page's rows); extras: what the reader holds beside its sessions
    (residency.Extras: counted against the cap, given up first past it; None: nothing).
    Session ids are the caller's to validate; none is used as a path."""

    def __init__(self, spec: StateSpec, cfg: StoreConfig, ident: FileIdentity, grid: int,
                 extras: Extras | None = None):
        self.spec, self.cfg = spec, cfg
        disk = DiskStore(cfg.disk_dir, ident) if cfg.disk_dir is not None else None
        self.store = PageStore(spec, grid, identity_key(ident.as_meta()), cfg.gdn_bytes,
                               disk=disk, prefetch_bytes=cfg.prefetch_bytes)
        if spec.device.type == "cuda":       # the pages the cap holds, allocated up front
            pages_bytes = max(0, cfg.resident_bytes - cfg.gdn_bytes)
            self.store.pool.grow(pages_bytes // self.store.pool.page_bytes)
        self.resident: dict[str, SessionState] = {}
        self.residency = Residency(cfg, self.store, extras)
        self._clock = 0
        # this server's name for routers: the token its manifests carry (one without a disk)
        self.writer = disk.writer if disk is not None else writer_token()

    @property
    def counters(self):
        """The page store's counters (pages.PageCounters: prefix-cache hits by tier, reads,
        re-reads by cause, turn starts), since this table was made."""
        return self.store.counters

    def park(self, sid: str) -> None:
        """Move resident session `sid` to disk (or drop its tensors without a disk); a later
        get restores it. KeyError when it is not resident."""
        if sid not in self.resident:
            raise KeyError(f"session {sid!r} is not resident")
        self.residency.park(self.resident, sid)

    def forget_memory(self) -> None:
        """Forget what memory caches and no session references: the cached pages (free, keyed)
        and every loose GDN entry, as when other sessions reuse their memory; a later prompt
        or restore finds them on disk, or reads them again."""
        self.store.manager.forget_cached()
        self.store.gdn.evict(0)

    def knows(self, sid: str) -> bool:
        """Whether the session is resident, parked or has a file on disk; restores nothing."""
        return sid in self.resident or self.residency.knows(sid)

    def prefetch(self, sid: str, prompt=None, before_read=None) -> int:
        """Read ahead the page files a restore of `sid` (parked: its held ids) or a resume of
        `prompt` (a session this table does not hold: what a prefix on disk gives it) would
        read (disk_io.prefetch_pages, which calls `before_read()` before its first file
        read); nothing for a resident session or without a disk.
        Called without the reader's lock (it changes only the page store's `prefetched`), so
        the restore under the lock only copies the rows into the pool. Returns the pages
        read."""
        if sid in self.resident or self.store.prefetched is None:
            return 0
        rec = self.residency.parked.get(sid)
        ids = rec.ids if rec is not None else prompt
        return 0 if ids is None else prefetch_pages(self.store, ids, before_read=before_read)

    def get(self, sid: str) -> SessionState:
        """The session's state, restored from disk when parked; it becomes the most recently
        used, and after a restore the others are parked past the cap (the calls that grow a
        resident state settle after their work; settling on every call summed every session's
        bytes for each id a host streams). Raises KeyError for an unknown session (also one
        known only by a file that was refused and set aside)."""
        st = self.resident.get(sid)
        restored = st is None
        if restored:
            st = self.residency.restore(sid)
            if st is None:
                raise self.unknown(sid)
            self.resident[sid] = st
        self._clock += 1
        st.last_used = self._clock
        if restored:
            self.settle(sid)
        return st

    def create(self, sid: str) -> SessionState:
        """A new empty resident state for `sid`, replacing what was held (none, or a record
        whose file was refused); the most recently used."""
        old = self.resident.pop(sid, None)
        if old is not None:
            release_state(self.store, old)
        if self.residency.refused(sid) is not None:     # a new start: no longer listed
            self.residency.unusable.pop(self.store.disk.manifest_path(sid), None)
        self.resident[sid] = new_state(self.spec)
        return self.get(sid)

    def settle(self, keep: str | None) -> None:
        """Keep resident bytes within the cap, sparing the session in use; when evicted pages
        or GDN entries were written to disk since, the disk's cap and TTL (Residency's sweep,
        when due)."""
        self.residency.make_room(self.resident, keep)
        if self.store.prefetched is not None:         # rows read ahead and never taken
            self.store.prefetched.drop_aged()
        spill = self.store.spill
        if spill is not None and spill.wrote:
            spill.wrote = False
            self.residency.upkeep()

    def names(self) -> list[str]:
        """Resident session ids, most recently used first, then parked ones."""
        resident = sorted(self.resident, key=lambda s: -self.resident[s].last_used)
        return resident + [s for s in self.residency.parked if s not in self.resident]

    def position(self, sid: str) -> tuple[int, int]:
        """(ids held, C) without restoring the session or making it the most recently used (a
        file that appeared on disk since the table started is read for its header and ids
        only). KeyError when unknown, or known only by a file this reader cannot load."""
        st = self.resident.get(sid)
        if st is not None:
            return len(st.ids), st.committed
        rec = self.residency.record(sid)       # adopts a file another process wrote since
        if rec is None:
            raise self.unknown(sid)
        return len(rec.ids), rec.committed_on_disk

    def holding(self, sid: str) -> tuple[int, int, bool, int | None]:
        """(ids held, C, resident, manifest version) without restoring the session or making
        it the most recently used: `resident` whether its state is in memory here, the
        version the number of the manifest this copy was written as or read from
        (disk.manifest.Manifest.seq; None before its first write). What tells, among servers
        on one folder, which holds a session's newest state. KeyError as `position`."""
        st = self.resident.get(sid)
        if st is not None:
            mark = st.manifest_mark
            return len(st.ids), st.committed, True, mark[1] if mark else None
        rec = self.residency.record(sid)
        if rec is None:
            raise self.unknown(sid)
        return len(rec.ids), rec.committed_on_disk, False, rec.mark[1] if rec.mark else None

    def unknown(self, sid: str) -> KeyError:
        """The KeyError for a session not held: unknown, or its manifest refused at start-up
        (with the reason)."""
        why = self.residency.refused(sid)
        if why is None:
            return KeyError(f"unknown session {sid!r}")
        return KeyError(f"session {sid!r} was not restored: its manifest was refused at "
                        f"start-up ({why}); send its turn again, or DELETE it")

    def held_ids(self, sid: str):
        """The session's ids (a list, or an int64 numpy array for a parked session: do not
        change it) without restoring it or making it the most recently used. KeyError when
        unknown."""
        st = self.resident.get(sid)
        if st is not None:
            return st.ids
        rec = self.residency.record(sid)
        if rec is None:
            raise KeyError(f"unknown session {sid!r}")
        return rec.ids

    def starts_with(self, sid: str, ids: Sequence[int]) -> bool:
        """Whether the session's ids begin with `ids`, without restoring it or copying its ids.
        KeyError when unknown."""
        held = self.held_ids(sid)
        if len(held) < len(ids):
            return False
        if isinstance(held, list):
            return held[:len(ids)] == list(ids)
        return bool(np.array_equal(held[:len(ids)], np.asarray(ids, dtype=np.int64)))

    def drop(self, sid: str) -> None:
        """Forget a session: its tensors, its record and its file (also one listed as refused
        at start-up). KeyError when unknown."""
        if not self.knows(sid) and self.residency.refused(sid) is None:
            raise KeyError(f"unknown session {sid!r}")
        st = self.resident.pop(sid, None)
        if st is not None:
            release_state(self.store, st)
        self.residency.forget(sid)

    def save(self, sid: str, stale: bool = False) -> bool:
        """Write the resident session's manifest (a turn's start or end; `stale`: before
        outputs, Residency.save_manifest) when there is a disk. Returns whether it was written
        (a failed write is logged and counted, never raised); for a parked session, whether
        its park wrote it. False also when another process wrote the session's manifest since
        this one last saw it: the resident copy is given back and the folder's version parked
        in its place (Residency.supersede)."""
        st = self.resident.get(sid)
        if st is None:
            rec = self.residency.parked.get(sid)
            if rec is None or rec.manifest is not None:
                return rec is not None
            st = self.get(sid)           # dropped (its park's write failed): written now
        try:
            return self.residency.save_manifest(sid, st, stale)
        except Superseded:
            self.residency.supersede(self.resident, sid)
            return False

    def sync(self, sid: str) -> bool:
        """With a shared folder, whether the resident copy of `sid` was older than the
        manifest on disk and was replaced by it (Residency.sync: restored on next use)."""
        return self.residency.sync(self.resident, sid)

    def close(self) -> None:
        """A planned stop: park every resident session (written to disk when there is one),
        and wait for the evicted pages and entries still being written."""
        self.residency.close(self.resident)
        if self.store.spill is not None:
            self.store.spill.flush()

    def server(self) -> dict:
        """This server as a router names it: `writer` (the token its manifests carry,
        DiskStore.writer; a token of the same form without a disk), `identity` (the hex key
        every page key is rooted in, the manifests' subfolder: servers with the same one can
        resume each other's sessions from a shared folder), `disk_shared` and `disk` (whether
        it has a disk tier)."""
        return {"writer": self.writer, "identity": self.store.root.hex(),
                "disk": self.store.disk is not None, "disk_shared": self.cfg.disk_shared}

    def stats(self) -> dict:
        """Per session: residency ("resident", "disk" or "dropped"), bytes it references
        (session.state_bytes: shared pages in full), C, backlog, checkpoints, ids, whether C
        is verified (held in memory; a parked session's C is its manifest's, after a restart
        lowered to the deepest line whose files are there and whole, until a restore checks
        its files, and a damaged file lowers it then), its manifest's version (`holding`); totals
        against the cap (resident_bytes counts a shared page once); pages by state, GDN
        entries, the page store's counters; counts of spills, drops, restores, refusals and
        deleted files; what memory forgot and what the disk got of it first
        (`_eviction_counts`); each session's warmth (warmth.Warmth: where its next turn
        resumes from memory, or memory and disk, its pages and GDN entries and their bytes)
        and this server's name for routers (`server`)."""
        page_bytes = self.store.pool.page_bytes
        on_disk = self.residency.disk_counts()        # lists the folder first when due
        per = {sid: {"residency": "resident", "bytes": state_bytes(st, page_bytes),
                     "committed": st.committed,
                     "backlog": st.backlog, "checkpoints": [cp.pos for cp in st.checkpoints],
                     "num_ids": len(st.ids), "stale": st.stale, "verified": True,
                     "version": st.manifest_mark[1] if st.manifest_mark else None,
                     **resident(self.store, st).as_dict()}
               for sid, st in self.resident.items()}
        for sid, rec in self.residency.parked.items():
            per[sid] = {"residency": "disk" if rec.manifest else "dropped", "bytes": 0,
                        "committed": rec.committed_on_disk,
                        "backlog": len(rec.ids) - rec.committed_on_disk, "checkpoints": [],
                        "num_ids": len(rec.ids), "stale": rec.stale,
                        "verified": False,    # C as its manifest says, checked at the restore
                        "version": rec.mark[1] if rec.mark else None,
                        **parked(self.store, rec.keys).as_dict()}
        c, m, gdn = self.residency.counters, self.store.manager, self.store.gdn
        pc = self.store.counters
        refusals = self.residency.refusals()     # every refusal, the listed ones included
        return {"sessions": per, "server": self.server(),
                "resident_bytes": self.residency.resident_bytes(self.resident),
                "pages": {"pinned": m.num_pinned, "cached": m.num_cached, "free": m.num_free,
                          "disk": on_disk["pages"]},
                "page_bytes": page_bytes, "pool_bytes": self.store.pool.nbytes,
                "gdn_entries": {"resident": len(gdn.entries), "disk": on_disk["gdn_entries"]},
                "gdn_entry_bytes": gdn.nbytes, "gdn_entries_by_kind": gdn.by_kind(),
                "prefix_cache_queried_tokens": pc.prefix_cache_queried_tokens,
                "prefix_cache_hit_tokens": dict(pc.prefix_cache_hit_tokens),
                "read_tokens": pc.read_tokens, "reread_tokens": dict(pc.reread_tokens),
                "turn_starts": dict(pc.turn_starts), "gdn_entry_hits": dict(pc.gdn_entry_hits),
                "gdn_entry_evictions": dict(gdn.evicted_by_kind),
                "resident_cap_bytes": self.cfg.resident_bytes,
                "disk_bytes": on_disk["bytes"],
                "num_resident": len(self.resident), "num_parked": len(self.residency.parked),
                "spills": c.spills, "drops": c.drops, "restores": c.restores,
                "restore_ms": c.restore_ms,
                # pages read ahead of restores (disk_io.prefetch_pages) and taken by them
                "prefetch": None if self.store.prefetched is None else
                self.store.prefetched.counts(),
                "refusals": sum(refusals.values()), "refusal_reasons": refusals,
                "deleted_files": c.deleted_files, "superseded": c.superseded,
                "write_errors": c.write_errors + (
                    self.store.spill.counters.write_errors if self.store.spill else 0),
                **_eviction_counts(self.store),
                "refused_sessions": [{"session": s, "file": p.name, "reason": why}
                                     for p, (s, why) in self.residency.unusable.items()]}


def _eviction_counts(store) -> dict:
    """Since start: GDN entries the table evicted (`gdn_entries_evicted`), cached pages whose
    memory the block manager handed out again (`pages_reused`), and of those the pages and
    entries written to disk first by key (`evicted_written`, spill.Spill; a file that existed
    already is not counted but in `evicted_already_on_disk`, with those whose write was
    queued; zeros without a disk), and the evicted entries not written
    (`gdn_entries_not_written`: tips that rotated out of their session's ring unused)."""
    spill = store.spill.counters if store.spill is not None else None
    return {"gdn_entries_evicted": store.gdn.num_evicted,
            "pages_reused": store.manager.num_reused,
            "evicted_written": {"page": spill.pages if spill else 0,
                                "gdn_entry": spill.entries if spill else 0},
            "gdn_entries_not_written": spill.entries_not_written if spill else 0,
            "evicted_already_on_disk": {"page": spill.on_disk["pages"] if spill else 0,
                                        "gdn_entry": spill.on_disk["entries"] if spill else 0}}

