"""How warm a session is on this server: what a router scores to send a session's next turn
where it costs the least (docs/scale.md). Looked up, never loaded: dict lookups in the block
manager and the GDN table, and set lookups in the disk tier's listing (no stat, no read), so
status can report it for every session under the one lock.

For a session of C committed ids:
- warm_tokens: the line its next turn resumes at from memory alone, with nothing read or
  loaded: C for a resident session; for a parked one, the deepest line L such that every page
  of its chain below L is in memory (pinned or cached, findable by key) and a GDN entry at L is
  in the table (its states at C stay there as an unreferenced entry after a park while the
  budget allows);
- held_tokens: the same with the disk tier's listing too (pages and entries whose files this
  server sees): where a restore lands without reading, loading from disk what memory lacks.
  With a folder several servers share (disk_shared) this is the same on every one of them;
  only warm_tokens tells them apart;
- num_pages_memory, num_pages_disk: pages of its chain [0, C) in memory and in the folder's
  listing (disk.DiskStore.page_listed: at most INDEX_MAX_AGE_S old); kv_bytes: the memory
  ones' bytes;
- num_gdn_entries, gdn_bytes: GDN table entries it holds (resident: its checkpoints and tip
  ring, each once; parked: entries at its chain's lines still in the table) and their bytes,
  plus, resident, its own states at C (one entry's bytes, held by no table entry).
A parked session's figures are lookups by key: a hint, not a promise (a restore checks every
file it loads, and memory may reuse a cached page before the next turn comes).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from block_store.pages import PageStore
from block_store.session import SessionState


@dataclass(frozen=True)
class Warmth:
    """What a session's next turn finds on this server (module doc); token counts in ids,
    bytes in bytes."""

    warm_tokens: int
    held_tokens: int
    num_pages_memory: int
    num_pages_disk: int
    kv_bytes: int
    num_gdn_entries: int
    gdn_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def resident(store: PageStore, st: SessionState) -> Warmth:
    """The warmth of a resident session: its pages [0, C), its GDN states at C and the distinct
    entries of its checkpoints and tip ring; warm and held at C."""
    entries = {id(e): e for e in [cp.entry for cp in st.checkpoints] + st.tip}
    live = sum(c.nbytes + r.nbytes for c, r in st.gdn)
    return Warmth(warm_tokens=st.committed, held_tokens=st.committed,
                  num_pages_memory=len(st.pages), num_pages_disk=_on_disk(store, st.keys),
                  kv_bytes=len(st.pages) * store.pool.page_bytes,
                  num_gdn_entries=len(entries),
                  gdn_bytes=live + sum(e.nbytes for e in entries.values()))


def parked(store: PageStore, keys: list[bytes]) -> Warmth:
    """The warmth of a parked session whose pages [0, C) have `keys` (one a page, in order):
    looked up in memory (the block manager's keys, the GDN table) and the disk's listing."""
    g, by_key, gdn, disk = store.grid, store.manager.by_key, store.gdn.entries, store.disk
    warm = held = num_memory = num_entries = entry_bytes = 0
    memory_chain = disk_chain = True        # every page below this line found so far
    for i, key in enumerate(keys):
        line = (i + 1) * g
        in_memory = key in by_key
        on_disk = disk is not None and disk.page_listed(key)
        num_memory += in_memory
        memory_chain = memory_chain and in_memory
        disk_chain = disk_chain and (in_memory or on_disk)
        entry = gdn.get(key)
        if entry is not None and entry.line == line:
            num_entries += 1
            entry_bytes += entry.nbytes
            warm = line if memory_chain else warm
            held = line if disk_chain else held
        elif disk_chain and disk is not None and disk.has_entry(key):
            held = line
    return Warmth(warm_tokens=warm, held_tokens=held, num_pages_memory=num_memory,
                  num_pages_disk=_on_disk(store, keys),
                  kv_bytes=num_memory * store.pool.page_bytes, num_gdn_entries=num_entries,
                  gdn_bytes=entry_bytes)


def _on_disk(store: PageStore, keys: list[bytes]) -> int:
    """How many of `keys` the disk's listing holds (0 without a disk)."""
    disk = store.disk
    return 0 if disk is None else sum(disk.page_listed(k) for k in keys)
