"""What memory forgets goes to the disk tier first (issue 16, item 6): a cached page
(unreferenced, keyed) whose memory the block manager hands out again (pool.PagePool.allocate),
and a loose GDN entry the table evicts (gdn_table.GdnTable.evict; not a tip that rotated out
of its session's ring unused, nor an entry given up above a rewrite's first difference,
GdnTable.give_up), are written by key
(disk.DiskStore.write_page / write_entry) unless the disk holds them already, so a later
prompt with that prefix, in any session or any process on the folder, resumes from disk
through the one lookup (pages.find_resume).

What must happen before the memory is reused happens in the caller's thread: a page's rows
(`page_rows`: kv [num_attention, 2, G, Hkv, D] in the pool's dtype; 6 MiB a page on the 0.8B)
and an entry's states (per GDN layer conv [conv_dim, W] and recurrent [HV, K, V] fp32, never
changed once stored; the evicted entry is referenced by nothing else) are queued for copying to
the CPU on the caller's CUDA stream (`copy_off`: into page-locked memory, asynchronously, so the
caller does not wait for its forward in flight; a later forward that writes the page's rows
again is queued after the copy on the same stream; no copy when they are on the CPU already),
and the writer waits for those copies before it reads them. That order holds on one stream:
the shadow's threads share the legacy default stream, and the ration's slice, which runs on
the host's stream, synchronises the whole device before its chunks
(scheduling.host.Host.between_rounds), so a copy queued by another thread is done before the
slice writes that page again. The file is written
by WRITERS background threads; at most `max_pending` writes are queued (a caller past it waits
for the oldest), so the host memory held is bounded and evictions back to back go at the disk's
pace (evals/spill_probe.py at cadb457, 0.8B pages on the H200 host: 1.4-1.5 ms median a page on the
caller's side, about 3 ms a page on average over 64 in a row; one writer: 4.6-5.2 ms median). A
page's content is a pure function of its key, so a write raced by another writer of the same key (a
park, another process) leaves the same bits (files.atomic_save renames whole files). A failed write
is logged and counted (`counters.write_errors`), never raised into a read. Without a disk there is
no Spill: nothing is copied or written.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from block_store.disk.store import DiskStore
from block_store.memory.gdn_table import GdnEntry
from block_store.memory.kv_pool import KvPool
from block_store.memory.pool import Page

log = logging.getLogger(__name__)
MAX_PENDING = 16      # writes queued at most (about 100 MB of pages on the 0.8B)
WRITERS = min(4, os.cpu_count() or 1)      # threads writing files (safetensors frees the GIL)


def page_rows(pool: KvPool, index: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
    """Page `index`'s rows copied to the CPU, kv [num_attention, 2, G, Hkv, D] (what a page
    file holds), in one copy (kv_pool.pages_to_cpu gathers then copies: twice the time for one
    page on the CPU), begun as `copy_off` begins it: (rows, the event to wait for first)."""
    # the pool's block is never freed while serving (only when it grows): no record_stream,
    # which would tie the whole block's reuse to this stream's work
    (rows,), ready = copy_off([pool.block[:, :, index]], always_copy=True, freed=False)
    return rows, ready


def copy_off(tensors, always_copy: bool = False, freed: bool = True
             ) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
    """CPU copies of `tensors`, begun now without waiting for the device: each CUDA tensor into
    page-locked memory, asynchronously on the current stream after the work queued on it, with
    one event recorded after the last copy. `freed`: the tensors' device memory may be freed
    once this returns (an evicted entry's), so it is kept from another stream's reuse until the
    copies are done (record_stream). Returns the copies and that event (None when no tensor was
    on CUDA, or when page-locked memory could not be had: then the copies were made the old
    way, `.to("cpu")`, waiting for the device); whoever reads a copy waits for the event first
    (Event.synchronize: a blocking event, so the waiting thread sleeps, without the GIL). A
    CPU tensor is returned as it is (`always_copy`: copied). The first copies of a size
    allocate the page-locked memory (cudaHostAlloc, which may wait for the device); later ones
    reuse it from torch's caching host allocator (at most about max_pending writes' worth)."""
    if not any(t.is_cuda for t in tensors):
        return [torch.empty(t.shape, dtype=t.dtype).copy_(t) if always_copy else t
                for t in tensors], None
    try:
        hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda) for t in tensors]
    except RuntimeError:                   # no page-locked memory: copy and wait, as before
        return [t.to("cpu", copy=always_copy) for t in tensors], None
    stream = None
    for t, host in zip(tensors, hosts):
        if not t.is_cuda:
            host.copy_(t)
            continue
        stream = torch.cuda.current_stream(t.device)
        host.copy_(t, non_blocking=True)
        if freed:
            t.record_stream(stream)
    ready = torch.cuda.Event(blocking=True)
    ready.record(stream)
    return hosts, ready


def bind_device(device: torch.device) -> None:
    """Make `device` the calling thread's current CUDA device (nothing for another kind): a
    new thread's CUDA calls would otherwise set up a context on cuda:0, another rank's GPU
    where the shadow runs on a later one. A "cuda" without an index is the current device,
    which the thread has already."""
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)


@dataclass
class SpillCounters:
    """Since start: pages and GDN entries written on eviction (files that existed already are
    not counted: `on_disk` counts those), evicted entries not written (tips that rotated out
    unused, entries given up above a rewrite's first difference), writes that failed."""

    pages: int = 0
    entries: int = 0
    entries_not_written: int = 0
    write_errors: int = 0
    # evicted with their file on disk already, or its write queued: {"pages", "entries"}
    on_disk: dict = field(default_factory=lambda: {"pages": 0, "entries": 0})


class Spill:
    """Args: disk (the disk tier); pool (the KV pool whose pages are evicted); max_pending (>= 1,
    writes queued at most). Hooked into the block manager (PagePool.on_reuse) and the GDN table
    (GdnTable.on_evict) by pages.PageStore. Not thread-safe: called under the reader's lock."""

    def __init__(self, disk: DiskStore, pool: KvPool, max_pending: int = MAX_PENDING):
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.disk, self.pool, self.max_pending = disk, pool, max_pending
        self.counters = SpillCounters()
        self.wrote = False                   # something written since the owner last looked
        self._pages: dict[bytes, Future] = {}
        self._entries: dict[bytes, Future] = {}
        self._queue: deque[tuple[dict, bytes, Future]] = deque()
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()        # the counters, shared with the writer threads

    # -- what memory forgets --------------------------------------------------------------------
    def page(self, page: Page) -> None:
        """Before `page`'s memory is reused: its content, when keyed, queued for writing under
        its key with its ids, unless its file exists (its time is renewed then) or its write is
        queued. Never raises."""
        key = page.key
        if key is None:
            return
        if self._queued(self._pages, key):
            self._on_disk("pages")
            return
        try:
            if self.disk.keep_page(key):
                self._on_disk("pages")
                return
            rows, ready = page_rows(self.pool, page.index)
        except Exception as e:             # a folder gone, a device error: the read goes on
            self._failed("page", key, e)
            return
        self._submit(self._pages, key, ready, self.disk.write_page, key, page.ids, rows)

    def entry(self, entry: GdnEntry) -> None:
        """Before `entry` leaves the GDN table: its states, line and kind queued for writing
        under its key, unless the disk's index holds it, its write is queued, or it is not
        worth writing (GdnEntry.spill False, no hits: a tip that rotated out of its session's
        ring unused, an entry given up above a rewrite's first difference; counted in
        `entries_not_written`, nothing copied). Never raises."""
        key = entry.key
        if not entry.spill and entry.hits == 0:      # given up unused: not worth it
            with self._lock:
                self.counters.entries_not_written += 1
            return
        if self._queued(self._entries, key):
            self._on_disk("entries")
            return
        try:
            if self.disk.has_entry(key):
                self._on_disk("entries")
                return
            flat, ready = copy_off([x for pair in entry.states for x in pair])
        except Exception as e:
            self._failed("GDN entry", key, e)
            return
        states = list(zip(flat[0::2], flat[1::2]))
        self._submit(self._entries, key, ready, self.disk.write_entry, key, entry.line,
                     states, entry.kind)

    # -- waiting --------------------------------------------------------------------------------
    def wait_page(self, key: bytes) -> None:
        """Return once page `key`'s queued write (if any) is done (a lookup by file)."""
        fut = self._pages.get(key)
        if fut is not None:
            fut.result()

    def wait_entry(self, key: bytes) -> None:
        """Return once entry `key`'s queued write (if any) is done."""
        fut = self._entries.get(key)
        if fut is not None:
            fut.result()

    def flush(self) -> None:
        """Return once every queued write is done (a planned stop; tests)."""
        while self._queue:
            self._pop()

    def close(self) -> None:
        """flush, then stop the writer threads (a later write starts others)."""
        self.flush()
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    # -- inside ---------------------------------------------------------------------------------
    @staticmethod
    def _queued(pending: dict[bytes, Future], key: bytes) -> bool:
        fut = pending.get(key)
        return fut is not None and not fut.done()

    def _pop(self) -> None:
        pending, key, fut = self._queue.popleft()
        fut.result()                         # _write never raises
        if pending.get(key) is fut:
            del pending[key]

    def _submit(self, pending: dict, key: bytes, ready, fn, *args) -> None:
        """fn(*args) queued for a writer thread, which first waits for `ready` (copy_off's
        event; None: nothing to wait for)."""
        while self._queue and (self._queue[0][2].done() or
                               len(self._queue) >= self.max_pending):
            self._pop()
        if self._threads is None:          # each writer on the pool's device (its CUDA
            #                                  calls: the copies' events, page-locked frees)
            self._threads = ThreadPoolExecutor(WRITERS, thread_name_prefix="shadow-spill",
                                               initializer=bind_device,
                                               initargs=(self.pool.spec.device,))
        fut = self._threads.submit(self._write, pending is self._pages, key, ready, fn, args)
        pending[key] = fut
        self._queue.append((pending, key, fut))

    def _write(self, is_page: bool, key: bytes, ready, fn, args) -> None:
        try:
            if ready is not None:
                ready.synchronize()          # the copies off the device are done
            wrote = fn(*args)
        except Exception as e:
            self._failed("page" if is_page else "GDN entry", key, e)
            return
        with self._lock:
            if wrote:
                self.wrote = True
                if is_page:
                    self.counters.pages += 1
                else:
                    self.counters.entries += 1

    def _on_disk(self, what: str) -> None:
        """Count an evicted page or entry the disk holds already (or is being written)."""
        with self._lock:
            self.counters.on_disk[what] += 1

    def _failed(self, what: str, key: bytes, e: Exception) -> None:
        log.warning("could not write evicted %s %s to disk (%s: %s)", what, key.hex()[:16],
                    type(e).__name__, e)
        with self._lock:
            self.counters.write_errors += 1
