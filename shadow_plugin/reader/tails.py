"""Question tails kept between questions: the forward of ids[line:cut] below a fork's own ids.

A fork at `at` forwards, from the grid line `line` at or below `at` (shadow_plugin.reader.fork):
first the tail ids[line:cut], cut = at // ROW_ALIGN * ROW_ALIGN (adapters.ROW_ALIGN, 64 rows)
when that holds a quarter of a grid or more (fork.tail_cut), as a forward of its own that keeps
its states (Adapter.read_rows), then ids[cut:at] and the question from cut. The tail's result,
KV rows [line, cut) and the GDN states after cut, depends only on ids[:cut]: the state at the
line is a pure function of ids[:line] (the contract, docs/design.md), which the page key of the
page below the line names. So the reader keeps it, keyed by (that key, ids[line:cut]), and a
question at the same place (the next question of a session, several questions at once, another
session with the same ids) forwards ids[cut:at] and its own ids only: at most 63 ids of the
session instead of up to grid - 1 (a tail shorter than a quarter of a grid is not cut: it goes
with the question, under grid / 4 + 64 ids). On an H100 at 100k ids (0.8B, FA4) the router
question took 5.0 ms on a kept 506-id tail against 10.4 ms in one forward, 11.1 ms when the tail
was not kept (docs/tail-bench-h100-2026-12-05.log), and 4.6 ms on a kept 128-id tail against
6.9 ms in one forward (docs/tail-bench-h100-2026-12-05-b.log).

Held: one page (its rows [0, cut - line) the tail's KV rows, one reference) and the GDN states,
per tail: a page and a GDN entry's bytes (about 25 MB for the 0.8B at grid 512, bf16). At most
`max_tails` are kept, the least recently used given up first; a fork copies the page into one
of its own (it writes its rows above cut there). Pages and states count in the reader's
resident bytes: past its cap the tails are given up, least recently used first, before any
session is parked (block_store.residency.Extras), and the idle window makes none that would
not fit.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from block_store import PageStore
from block_store.memory.layout import GdnState
from block_store.memory.pool import Page


@dataclass
class Tail:
    """A tail's forward: `page` holds KV rows [line, line + len(ids)) at its rows [0,
    len(ids)) (one reference, the holder's); gdn: the GDN states after the last id (per GDN
    layer (conv [conv_dim, W] model dtype, recurrent [HV, K, V] fp32)); key: the page key of
    ids[:line] (the store's root at line 0); ids: ids[line:cut]."""

    key: bytes
    line: int
    ids: tuple[int, ...]
    page: Page
    gdn: GdnState

    @property
    def nbytes(self) -> int:
        """The GDN states' bytes (the page's are the pool's page_bytes)."""
        return sum(c.nbytes + r.nbytes for c, r in self.gdn)


def base_key(store: PageStore, keys: list[bytes], line: int) -> bytes:
    """The page key naming ids[:line] of a state whose page keys are `keys` (at least line /
    grid of them): the key of the page below the line, the store's root at 0."""
    return keys[line // store.grid - 1] if line else store.root


class Tails:
    """The tails a reader keeps (at most max_tails, >= 0; 0 keeps none), by (base key, tail
    ids), and each session's tip tail (the one kept at its end, `keep`'s owner, or found held
    there, `claim`: sessions with the same ids share one): a session's newer tip tail
    replaces its older one, whose line the session has left, unless it is another session's
    tip (before this rule the H100 vLLM trial's shadow made 153 tails over about 280 turns of
    two sessions and evicted 145, least recently used first, with 4 hits:
    docs/vllm-trial-h100-2026-12-05.json). Counters: num_hits (a fork found
    its tail), num_made (tails forwarded and kept), num_evicted (given up for room or
    dropped), num_replaced (a session's older tip tail given up for its newer one). Raises
    ValueError for a negative max_tails."""

    def __init__(self, max_tails: int):
        if not isinstance(max_tails, int) or isinstance(max_tails, bool) or max_tails < 0:
            raise ValueError(f"max_tails must be an integer >= 0, got {max_tails!r}")
        self.max_tails = max_tails
        self._held: OrderedDict[tuple[bytes, tuple[int, ...]], Tail] = OrderedDict()
        self._tips: dict[str, tuple[bytes, tuple[int, ...]]] = {}   # session -> its tip's key
        self.num_hits = self.num_made = self.num_evicted = self.num_replaced = 0

    def __len__(self) -> int:
        return len(self._held)

    def find(self, key: bytes, ids) -> Tail | None:
        """The tail of ids (ids[line:cut]) over the base named by key, made most recent; None
        when not held."""
        k = (key, tuple(ids))
        tail = self._held.get(k)
        if tail is not None:
            self._held.move_to_end(k)
            self.num_hits += 1
        return tail

    def has(self, key: bytes, ids) -> bool:
        """Whether that tail is held (not counted as a hit, its recency unchanged)."""
        return (key, tuple(ids)) in self._held

    def holds(self, tail: Tail) -> bool:
        """Whether this very tail is held (its page is then this holder's to give back)."""
        return self._held.get((tail.key, tail.ids)) is tail

    def keep(self, store: PageStore, tail: Tail, owner: str | None = None) -> bool:
        """Hold `tail` (its page's reference passes to this holder), the least recently used
        given up (their pages back) while more than max_tails would be held. owner: the
        session whose end the tail is at (its tip tail), or None: the owner's older tip tail,
        if still held and no other session's tip, is given up first. Returns False, the page
        left to the caller, when none are kept or one of these ids is held (`claim` it)."""
        k = (tail.key, tail.ids)
        if self.max_tails == 0 or k in self._held:
            return False
        if owner is not None:
            self._set_tip(store, owner, k)
        self._held[k] = tail
        self.num_made += 1
        while len(self._held) > self.max_tails:
            self.drop_oldest(store)
        return True

    def claim(self, store: PageStore, key: bytes, ids, owner: str) -> None:
        """The held tail of ids over key (found at owner's end, not made) is owner's tip tail
        too (sessions with the same ids share it): owner's older tip given up as `keep`
        gives it up, this one kept while any session's tip. Nothing when it is not held."""
        k = (key, tuple(ids))
        if k in self._held:
            self._set_tip(store, owner, k)

    def forget(self, owner: str) -> None:
        """Owner (a dropped session) has no tip tail any more; the tail stays (by content)."""
        self._tips.pop(owner, None)

    def replaced_bytes(self, owner: str, page_bytes: int) -> int:
        """Bytes (its page, page_bytes, and GDN states) that owner's newer tip tail would give
        back (`_replaced`), else 0."""
        old = self._replaced(owner)
        return 0 if old is None else page_bytes + self._held[old].nbytes

    def _replaced(self, owner: str, new=None):
        """The key of owner's tip tail that a newer tip (key `new`) gives up: held, not `new`
        and no other session's tip; else None."""
        old = self._tips.get(owner)
        if old is None or old == new or old not in self._held or any(
                tip == old and o != owner for o, tip in self._tips.items()):
            return None
        return old

    def _set_tip(self, store: PageStore, owner: str, k) -> None:
        """Owner's tip is the tail of key k now: its older one (`_replaced`) is given up
        (num_replaced)."""
        old = self._replaced(owner, k)
        if old is not None:
            store.manager.release(self._held.pop(old).page)
            self.num_replaced += 1
        self._tips[owner] = k

    def state_bytes(self) -> int:
        """The held tails' GDN states' bytes (their pages count as referenced pages):
        block_store.residency.Extras."""
        return sum(t.nbytes for t in self._held.values())

    def give_up(self, store: PageStore) -> bool:
        """drop_oldest: what the session table gives up past its cap before parking a
        session (block_store.residency.Extras)."""
        return self.drop_oldest(store)

    def drop_oldest(self, store: PageStore) -> bool:
        """Give up the least recently used tail (its page back); False when none is held."""
        if not self._held:
            return False
        k, old = self._held.popitem(last=False)
        store.manager.release(old.page)
        self._forget_tip(k)
        self.num_evicted += 1
        return True

    def drop_all(self, store: PageStore) -> int:
        """Give every tail up (their pages back); returns how many."""
        n = len(self._held)
        for tail in self._held.values():
            store.manager.release(tail.page)
        self._held.clear()
        self._tips.clear()
        self.num_evicted += n
        return n

    def _forget_tip(self, k) -> None:
        """No session's tip is the tail of key k any more."""
        for owner in [o for o, tip in self._tips.items() if tip == k]:
            del self._tips[owner]

    def pages(self) -> list[Page]:
        """The pages the held tails reference (one reference each)."""
        return [t.page for t in self._held.values()]

    def nbytes(self, page_bytes: int) -> int:
        """Bytes held: each tail's page (page_bytes) and GDN states."""
        return len(self._held) * page_bytes + self.state_bytes()

    def stats(self) -> dict:
        """Counts: tails_held (now), tail_hits, tails_made, tails_evicted, tails_replaced
        (since the start)."""
        return {"tails_held": len(self._held), "tail_hits": self.num_hits,
                "tails_made": self.num_made, "tails_evicted": self.num_evicted,
                "tails_replaced": self.num_replaced}
