"""The page store: the KV pool (kv_pool.KvPool and its block manager), the GDN table
(gdn_table.GdnTable), the identity key every page key chain starts from, and the one lookup a
prompt resumes through (`find_resume`): its own older pages after a rewrite and another
session's shared prefix are found the same way.

A prompt resumes at the deepest grid line L such that every page below L is held, in memory
or on disk (disk.DiskStore, by key), and the GDN states at L are known (the session's own state
at C, or a GDN entry at L in memory or on disk); never from KV pages without the state at their
end (the bug classes of vLLM #43090 and LMCache #2845). What lies on disk is loaded by
disk_io.load_resume.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from block_store.disk.prefetch import PrefetchedPages
from block_store.disk.store import DiskStore
from block_store.memory.gdn_table import GdnEntry, GdnTable
from block_store.memory.keys import next_key
from block_store.memory.kv_pool import KvPool, PagedKv
from block_store.memory.layout import GdnState, StateSpec
from block_store.memory.pool import Page, PoolFull
from block_store.spill import Spill


@dataclass
class PageCounters:
    """Counters since start, under the names of /metrics without `shadow_` and `_total`:
    prefix_cache_queried_tokens (prompt ids looked up), prefix_cache_hit_tokens (ids resumed
    from held pages and state: memory), read_tokens (ids read into committed state),
    reread_tokens by cause (ids read again below the furthest C their session had committed,
    under the cause of the rewrite that sent it back: 'bpe', 'template' or 'other'),
    turn_starts by fresh ('true' / 'false'), gdn_entry_hits by the entry's kind (resumes and
    held chunks served by GDN entries of each kind: what each kind earned)."""

    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: dict[str, int] = field(
        default_factory=lambda: {"memory": 0, "disk": 0})
    read_tokens: int = 0
    reread_tokens: dict[str, int] = field(
        default_factory=lambda: {"bpe": 0, "template": 0, "other": 0})
    turn_starts: dict[str, int] = field(default_factory=lambda: {"true": 0, "false": 0})
    gdn_entry_hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("checkpoint", "shared", "tip", "junction", "state"), 0))


class PageStore:
    """Args: spec; grid (G: page rows); root (keys.identity_key of the reader's identity);
    gdn_budget_bytes (what unreferenced GDN entries may keep); num_pages: pages allocated up
    front (on CUDA the table asks for what the resident cap holds, so that no chunk pays for
    copying the pool into a larger one); disk: the disk tier (None: none). More pages are
    added as needed (`allocate`); the caller (table.SessionTable) keeps the cap. With a disk,
    `spill` (spill.Spill) writes a cached page before its memory is reused and a loose GDN
    entry before it is evicted, by key, unless the disk holds them (None without a disk);
    prefetch_bytes: what `prefetched` (disk.prefetch.PrefetchedPages, with a disk) may hold."""

    def __init__(self, spec: StateSpec, grid: int, root: bytes, gdn_budget_bytes: int,
                 num_pages: int = 0, disk: DiskStore | None = None, prefetch_bytes: int = 0):
        self.spec, self.grid, self.root, self.disk = spec, grid, root, disk
        # page rows read ahead of a restore (disk_io.prefetch_pages; None without a disk)
        self.prefetched = PrefetchedPages(prefetch_bytes) \
            if disk is not None and prefetch_bytes > 0 else None
        self.pool = KvPool(spec, grid, num_pages)
        self.gdn = GdnTable(gdn_budget_bytes)
        self.counters = PageCounters()
        self.spill = Spill(disk, self.pool) if disk is not None else None
        if self.spill is not None:
            self.pool.manager.on_reuse = self.spill.page
            self.gdn.on_evict = self.spill.entry

    @property
    def manager(self):
        return self.pool.manager

    def allocate(self, grow: bool = True) -> Page:
        """A page to write (one reference, no key): a free one, the least recently freed
        first; with none free, the pool grows by half (at least 8 pages) unless `grow` is
        off. Raises PoolFull when none is free and the pool may not grow."""
        try:
            return self.manager.allocate()
        except PoolFull:
            if not grow:
                raise
        self.pool.grow(self.pool.num_pages + max(8, self.pool.num_pages // 2))
        return self.manager.allocate()

    def copy(self, page: Page) -> Page:
        """A new page (one reference, no key: `allocate`) holding page's rows. Raises
        PoolFull as allocate, and what the copy raises (the new page given back then)."""
        new = self.allocate()
        try:
            self.pool.copy_page(page.index, new.index)
        except BaseException:
            self.manager.release(new)
            raise
        return new

    def view(self, pages: list[Page], extra: list[Page] = ()) -> PagedKv:
        return PagedKv(self.pool, [p.index for p in pages] + [p.index for p in extra])

    def key_after(self, keys: list[bytes], page_ids) -> bytes:
        """The key of the page after those of `keys` holding `page_ids`."""
        return next_key(keys[-1] if keys else self.root, page_ids)

    def release_pages(self, pages: list[Page]) -> None:
        """One reference less on each, the last page first: a chain's head is freed last, so
        it is reused last (without it, the rest of the chain cannot be found)."""
        for p in reversed(pages):
            self.manager.release(p)

    def take_pages(self, pages: list[Page]) -> list[Page]:
        return [self.manager.take(p) for p in pages]

    def page_on_disk(self, key: bytes) -> bool:
        """Whether page `key`'s file is on disk (one stat), once its queued spill is written."""
        if self.spill is not None:
            self.spill.wait_page(key)
        return self.disk.has_page(key)

    def entry_on_disk(self, key: bytes, look: bool = False) -> bool:
        """DiskStore.has_entry, once entry `key`'s queued spill is written."""
        if self.spill is not None:
            self.spill.wait_entry(key)
        return self.disk.has_entry(key, look=look)


@dataclass
class Resume:
    """Where a prompt resumes: line L; pages (held, not yet referenced; None for a page found
    on disk, not yet loaded) and keys of the pages below L; the GDN states at L: 'own' (the
    session's own at C), a GdnEntry, the key of an entry on disk (bytes), or None (zero
    states, L = 0); matched: the line up to which the prompt's pages were found held (>= L:
    above L held pages end without a state, a junction worth keeping one at); num_loaded: the
    pages disk_io.load_resume brought from disk."""

    line: int
    pages: list[Page | None]
    keys: list[bytes]
    state: str | GdnEntry | bytes | None
    matched: int = 0
    num_loaded: int = 0

    @property
    def num_disk_pages(self) -> int:
        return sum(p is None for p in self.pages)


def find_resume(store: PageStore, own_pages: list[Page], own_keys: list[bytes],
                committed: int, prompt: list[int], d: int, use_disk: bool = True) -> Resume:
    """The deepest line L <= len(prompt) (whole pages) where `prompt` can resume: the
    session's own pages count up to its first difference d, others are looked up by key
    (ids compared; on disk, compared when loaded); the state at L is the session's own when
    L == C <= d, else a GDN entry (in memory, else on disk). Disk lookups (a file's
    existence, one stat) start where memory ends: a resident session's prompt costs one;
    GDN entries on disk are looked up in DiskStore's index, and by a stat only at the end of
    a page found on disk. `use_disk=False`: memory only."""
    g, pool, gdn = store.grid, store.manager, store.gdn
    disk = store.disk if use_disk else None
    best = Resume(0, [], [], None)
    pages: list[Page | None] = []
    keys: list[bytes] = []
    for i in range(len(prompt) // g):
        end = (i + 1) * g
        if i < len(own_pages) and end <= d:
            page, key = own_pages[i], own_keys[i]
        else:
            key = store.key_after(keys, prompt[i * g:end])
            page = pool.lookup(key, prompt[i * g:end])
            if page is None and (disk is None or not store.page_on_disk(key)):
                break
        pages.append(page)
        keys.append(key)
        if end == committed and end <= d:
            best = Resume(end, list(pages), list(keys), "own")
        else:
            entry = gdn.entries.get(key)
            if entry is not None and entry.line == end:
                best = Resume(end, list(pages), list(keys), entry)
    if disk is not None:                 # a deeper state on disk, deepest first
        for n in range(len(pages), best.line // g, -1):     # a stat only above pages on disk
            if keys[n - 1] not in gdn.entries and store.entry_on_disk(keys[n - 1],
                                                                      look=pages[n - 1] is None):
                best = Resume(n * g, pages[:n], keys[:n], keys[n - 1])
                break
    best.matched = len(pages) * g
    return best


def resume_states(store: PageStore, res: Resume, own: GdnState) -> GdnState:
    """The GDN states to hold at res.line: the session's own, a copy of the entry's, or
    zeros."""
    from block_store.memory.layout import clone_gdn, zero_gdn
    if res.state == "own":
        return own
    if res.state is None:
        return zero_gdn(store.spec)
    served(store, res.state)
    return clone_gdn(res.state.states)


def served(store: PageStore, entry) -> None:
    """A GDN entry served a resume or a held chunk: it becomes the most recently used, and
    its hits and the store's hits of its kind (PageCounters.gdn_entry_hits) count it."""
    store.gdn.get(entry.key)
    entry.hits += 1
    hits = store.counters.gdn_entry_hits
    hits[entry.kind] = hits.get(entry.kind, 0) + 1
