"""The block manager of the paged KV cache: a fixed set of pages (rows of the pool's tensors),
reference counts, a key -> page map, and a free queue in LRU order in which a freed page keeps
its key and content until the page is reused (so a later prompt, or another session, with the
same prefix finds it). Bookkeeping only: no tensors (the pool's tensors are indexed by
`Page.index`). Written after reading vLLM's v1 `BlockPool` and nano-vllm's `BlockManager`.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class PoolFull(RuntimeError):
    """Every page is in use (referenced): nothing can be allocated."""


@dataclass
class Page:
    """index: its row in the pool's tensors; key: the page key of its content (None while it
    holds none that can be shared: being written, or a fork's scratch); ids: the ids its
    content came from (a hit compares them); refs: sessions and forks using it."""

    index: int
    key: bytes | None = None
    ids: tuple[int, ...] | None = None
    refs: int = 0


class PagePool:
    """Args: num_pages (>= 0; `grow` adds more). Raises ValueError for a bad count.
    `on_reuse` (None: nothing): called with a cached page (keyed, unreferenced) just before it
    forgets its content, while its key, ids and memory are still its own (the disk tier writes
    it there: spill.Spill.page); it must not raise or change the pool."""

    def __init__(self, num_pages: int):
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        self.pages = [Page(i) for i in range(num_pages)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_pages))
        self.by_key: dict[bytes, int] = {}
        self.on_reuse: Callable[[Page], None] | None = None
        self.num_reused = 0              # cached pages whose content was forgotten, since start

    def grow(self, num_pages: int) -> None:
        """Hold `num_pages` pages: the new ones join the free queue's least recent end (used
        before cached pages are reused)."""
        new = range(len(self.pages), num_pages)
        self.pages += [Page(i) for i in new]
        for i in new:
            self.free[i] = None
            self.free.move_to_end(i, last=False)

    # -- finding and using pages ----------------------------------------------------------------
    def lookup(self, key: bytes, ids: Sequence[int]) -> Page | None:
        """The page holding `key`'s content (in use or cached in the free queue), when its ids
        are `ids` too; None otherwise. Takes no reference."""
        index = self.by_key.get(key)
        if index is None:
            return None
        page = self.pages[index]
        return page if page.ids == (ids if isinstance(ids, tuple) else tuple(ids)) else None

    def take(self, page: Page) -> Page:
        """One more reference to `page`; a cached page leaves the free queue (a hit)."""
        if page.refs == 0:
            self.free.pop(page.index, None)
        page.refs += 1
        return page

    def allocate(self) -> Page:
        """A page to write, with one reference and no key: the least recently freed one (its
        old key forgotten). Raises PoolFull when every page is in use."""
        if not self.free:
            raise PoolFull(f"all {len(self.pages)} pages are in use")
        index, _ = self.free.popitem(last=False)
        page = self.pages[index]
        if page.key is not None:
            if self.on_reuse is not None:
                self.on_reuse(page)
            if self.by_key.get(page.key) == index:
                del self.by_key[page.key]
            self.num_reused += 1
        page.key, page.ids, page.refs = None, None, 1
        return page

    def name(self, page: Page, key: bytes, ids: Sequence[int]) -> Page:
        """Record that `page` (written, referenced) now holds `key`'s content, from `ids`. When
        another page already holds that key, the map keeps the older one and this page stays
        unnamed (its content is the same: the caller should have looked it up first). Raises
        ValueError for a page without a reference or named with another key already."""
        if page.refs < 1:
            raise ValueError(f"page {page.index} is not referenced: name a page being written")
        if page.key is not None:
            if page.key != key:
                raise ValueError(f"page {page.index} holds another key's content already")
            return page
        if key not in self.by_key:
            self.by_key[key] = page.index
            page.key, page.ids = key, ids if isinstance(ids, tuple) else tuple(ids)
        return page

    def adopt(self, page: Page, key: bytes, ids: Sequence[int]) -> Page:
        """`page` (written, with one reference from the caller) holds `key`'s content: when
        another page holds it already, that page is taken and `page` released (the content
        is held once); else `page` is named. Returns the page to use."""
        ids = tuple(ids)                     # one tuple for the comparison and the name
        held = self.lookup(key, ids)
        if held is not None and held is not page:
            self.take(held)
            self.release(page)
            return held
        return self.name(page, key, ids)

    def release(self, page: Page) -> None:
        """One reference less; at none, the page joins the free queue's most recent end,
        keeping its key (an unnamed page, holding nothing to share, joins the least recent end:
        it is reused first). Raises ValueError for a page with no reference."""
        if page.refs < 1:
            raise ValueError(f"page {page.index} has no reference to release")
        page.refs -= 1
        if page.refs == 0:
            self.free[page.index] = None
            if page.key is None:             # nothing to keep: used before cached pages
                self.free.move_to_end(page.index, last=False)

    def forget_cached(self) -> int:
        """Every free page forgets the content it kept (as if reused, `on_reuse` called
        first): only referenced pages (and the disk tier) still hold what was read. Returns
        the pages forgotten. For tests and benchmarks of the disk tier."""
        n = 0
        for i in self.free:
            page = self.pages[i]
            if page.key is not None:
                if self.on_reuse is not None:
                    self.on_reuse(page)
                if self.by_key.get(page.key) == i:
                    del self.by_key[page.key]
                page.key, page.ids, n = None, None, n + 1
        self.num_reused += n
        return n

    # -- counts ---------------------------------------------------------------------------------
    @property
    def num_pinned(self) -> int:
        """Pages in use (referenced)."""
        return len(self.pages) - len(self.free)

    @property
    def num_cached(self) -> int:
        """Free pages that still hold a named content."""
        return sum(1 for i in self.free if self.pages[i].key is not None)

    @property
    def num_free(self) -> int:
        """Free pages holding nothing to share."""
        return len(self.free) - self.num_cached
