"""The GDN table, parallel to the page table: the recurrent and conv states of every linear
layer at a grid line L, keyed by the key of the page that ends at L (keys.page_keys), so a
session that holds the pages below L and finds the entry at L resumes there (its own older
line after a rewrite, or another session's prefix).

An entry: per GDN layer (conv [conv_dim, W] in the spec's dtype, recurrent [HV, K, V] fp32),
copies never changed once stored. Entries are referenced by the sessions that keep them as
checkpoints; unreferenced ones stay findable until the table's byte budget evicts them, least
recently used first within a rank (`rank`: what an entry is likely to save per byte). On the
0.8B an entry is about 19 MB, three 512-row KV pages.

The policy (issue 33): an entry a session gives up (`give_up`: a tip that rotated out of its
session's ring, a checkpoint past its session's cap, a tip or checkpoint above a rewrite's first
difference) that no one else references goes at once (written to disk first when it is worth it:
spill.Spill.entry), so one session's entries stay within its ring and checkpoints
(checkpoints.TIP_LINES + max_checkpoints + 2; the resumes an entry served earned it nothing once
its session lets it go: kept, a long session's entries that served one BPE resume each piled up
to the budget); the loose entries that stay (a parked or dropped session's checkpoints and tips,
its states at C, junctions, the shared line's) are evicted past the budget in rank order:
never-used checkpoints and tips first, then the states at C and entries that served resumes,
junctions and shared lines last. Referenced entries (a session's ring and checkpoints) are never
evicted, so neither a question's reads nor another session's can cost a session its tips.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from block_store.memory.layout import GdnState, clone_gdn

KINDS = ("checkpoint", "shared", "tip", "junction", "state")


def rank(entry: "GdnEntry") -> int:
    """Eviction rank of an unreferenced entry, lowest evicted first: 0 a checkpoint or tip
    that never served a resume (an early turn's prompt-end checkpoint of a parked session);
    1 a session's states at C ('state') or any entry that served a resume; 2 junctions and
    the shared line's (what the next session with that prefix resumes at)."""
    if entry.kind in ("junction", "shared"):
        return 2
    return 1 if entry.kind == "state" or entry.hits else 0


@dataclass
class GdnEntry:
    """key: the key of the page ending at `line`; states: the GDN states after ids[:line];
    refs: sessions keeping it; kind: why it was stored first ('checkpoint', 'shared', 'tip',
    'junction', 'state'); hits: prompts that resumed from it (what the entry earned); spill:
    written to disk when evicted (False for a tip that rotated out of its session's ring
    unreferenced and unused: `give_up`; a new reference sets it again)."""

    key: bytes
    line: int
    states: GdnState
    refs: int = 0
    kind: str = "checkpoint"
    hits: int = 0
    spill: bool = True
    # the states' bytes, counted once: they never change (the table's totals depend on it)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(c.nbytes + r.nbytes for c, r in self.states)


class GdnTable:
    """Entries by key, in LRU order (most recent last). budget_bytes: the most bytes its
    unreferenced entries may keep in all (`evict`); referenced ones are never evicted.
    `on_evict` (None: nothing): called with each entry `evict` drops, just before (the disk
    tier writes it: spill.Spill.entry); it must not raise or change the table."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.entries: OrderedDict[bytes, GdnEntry] = OrderedDict()
        self.num_evicted = 0
        # entries evicted or given up, by kind (what each kind lost: stats' gdn_entry_evictions)
        self.evicted_by_kind: dict[str, int] = dict.fromkeys(KINDS, 0)
        # bytes of all entries and of the unreferenced ones, kept as entries and references
        # come and go (a chunk's make_room reads them; summing the entries each time cost
        # about 0.1 ms of host time a chunk at 100k on the H200, before the chunk's launch)
        self._bytes = 0
        self._loose_bytes = 0
        self.on_evict: Callable[[GdnEntry], None] | None = None

    def get(self, key: bytes) -> GdnEntry | None:
        """The entry for `key` (made the most recently used), or None."""
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key: bytes, line: int, states: GdnState, kind: str = "checkpoint",
            owned: bool = False) -> GdnEntry:
        """The entry for `key`, stored now as a copy of `states` (marked `kind`) unless held
        already (the states at one key are the same bits whoever computed them), with one
        more reference. `owned`: `states` are handed over, stored without a copy (the caller
        gives them up: nothing may change them in place afterwards)."""
        entry = self.get(key)
        if entry is None:
            entry = GdnEntry(key, line, states if owned else clone_gdn(states), kind=kind)
            self.entries[key] = entry
            self._bytes += entry.nbytes
            self._loose_bytes += entry.nbytes
        if entry.refs == 0:
            self._loose_bytes -= entry.nbytes
        entry.refs += 1
        entry.spill = True
        return entry

    def release(self, entry: GdnEntry) -> None:
        """One reference less (the entry stays, unreferenced, until evicted). Raises
        ValueError for an entry without a reference."""
        if entry.refs < 1:
            raise ValueError(f"GDN entry at {entry.line} has no reference to release")
        entry.refs -= 1
        if entry.refs == 0:          # a referenced entry is never evicted or dropped: held
            self._loose_bytes += entry.nbytes

    def evict(self, budget_bytes: int | None = None) -> int:
        """Drop unreferenced entries, lowest `rank` first and least recently used first within
        a rank, while those hold more than the budget (default the table's). Returns the bytes
        freed."""
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        if self._loose_bytes <= budget:
            return 0
        freed = 0
        loose = sorted((e for e in self.entries.values() if e.refs == 0), key=rank)  # stable:
        for e in loose:                                        # LRU order within a rank
            if self._loose_bytes <= budget:
                break
            freed += self._remove(e)
        return freed

    def _remove(self, e: GdnEntry) -> int:
        """Forget unreferenced `e` after `on_evict`, counted as evicted; returns its bytes."""
        if self.on_evict is not None:
            self.on_evict(e)
        del self.entries[e.key]
        self._bytes -= e.nbytes
        self._loose_bytes -= e.nbytes
        self.num_evicted += 1
        self.evicted_by_kind[e.kind] = self.evicted_by_kind.get(e.kind, 0) + 1
        return e.nbytes

    def give_up(self, entry: GdnEntry, worth_writing: bool | None = None) -> None:
        """`release` for an entry its session no longer keeps (a tip rotated out of the
        ring, a checkpoint past the cap, either above a rewrite's first difference): when
        nothing references it then and it is a tip or a checkpoint, it goes at once (counted
        as evicted; `on_evict` sees it as any eviction, written to disk when there is one,
        unless not `worth_writing`: GdnEntry.spill False, counted as not written; default: a
        checkpoint is worth writing, a tip not). Raises ValueError as release."""
        self.release(entry)
        if entry.refs == 0 and entry.kind in ("tip", "checkpoint"):
            if not (entry.kind == "checkpoint" if worth_writing is None else worth_writing):
                entry.spill = False
            self._remove(entry)

    def drop(self, entry: GdnEntry) -> None:
        """Forget an unreferenced entry now (what `evict` does to the least recently used),
        without `on_evict`. Raises ValueError for a referenced entry or one not held."""
        if entry.refs or self.entries.get(entry.key) is not entry:
            raise ValueError(f"GDN entry at {entry.line}: only an unreferenced entry the table "
                             f"holds can be dropped (refs {entry.refs})")
        del self.entries[entry.key]
        self._bytes -= entry.nbytes
        self._loose_bytes -= entry.nbytes

    @property
    def loose_bytes(self) -> int:
        """Bytes of the unreferenced entries (what `evict` may drop)."""
        return self._loose_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of every entry held."""
        return self._bytes

    def by_kind(self) -> dict[str, dict[str, int]]:
        """Per kind: entries held, their bytes, and the resumes they served (held entries only;
        the counts since start are PageCounters.gdn_entry_hits and `evicted_by_kind`)."""
        out: dict[str, dict[str, int]] = {}
        for e in self.entries.values():
            k = out.setdefault(e.kind, {"entries": 0, "bytes": 0, "hits": 0})
            k["entries"] += 1
            k["bytes"] += e.nbytes
            k["hits"] += e.hits
        return out
