"""Page rows read from disk ahead of a restore, outside the reader's lock (disk_io.prefetch_pages),
for the restore to take instead of reading the files under the lock (disk_io.load_resume).

Why: a turn of a session parked on disk restores it under the shadow's lock, and a host step
waits for that lock (inside vLLM the step's start waits for the hold in flight): on the H200 a
100k-id session's restore took 140-177 ms (BENCHMARKS.md "Disk tier"), nearly all of it
reading and hashing about 1.2 GB of page files. Read before the lock is taken, only the copy
into the pool is left under it. A page file's content is fixed by its key (its ids and the
chain before them: memory.keys), so rows read ahead are the rows the restore would read,
whenever they are taken; the same checks ran on them (page_read.read_page_into).

Holds at most `max_bytes` (the least recently put go first) for at most `max_age_s` (aged
rows go at every call, and at the reader's settle: table.SessionTable.settle); every method is
thread-safe. Each page's rows are a buffer of their own, so what is held is what is counted.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict

import torch

MAX_AGE_S = 60.0          # rows not taken this long after their read are dropped


class PrefetchedPages:
    """kv rows [num_attention, 2, G, Hkv, D] (a page file's payload, on the CPU, page-locked on
    CUDA; their own storage, not a view) with the page's ids, by page key. max_bytes: what the
    rows held may take (a put past it drops the oldest first; rows larger than it are refused).
    Counters: num_put, num_taken, num_dropped (put and dropped unused: evicted, aged out or
    cleared), held_bytes."""

    def __init__(self, max_bytes: int, max_age_s: float = MAX_AGE_S):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes, self.max_age_s = max_bytes, max_age_s
        self._rows: OrderedDict[bytes, tuple[torch.Tensor, tuple, float]] = OrderedDict()
        self._lock = threading.Lock()
        self.held_bytes = 0
        self.num_put = self.num_taken = self.num_dropped = 0

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            self._drop_aged(time.monotonic())
            return key in self._rows

    def __len__(self) -> int:
        with self._lock:
            self._drop_aged(time.monotonic())
            return len(self._rows)

    def free_bytes(self) -> int:
        """What more may be held now (aged rows dropped first)."""
        with self._lock:
            self._drop_aged(time.monotonic())
            return self.max_bytes - self.held_bytes

    def put(self, key: bytes, ids, rows: torch.Tensor) -> bool:
        """Hold `rows` for page `key` whose ids are `ids` (replacing rows held for it). False,
        holding nothing new, when they alone exceed max_bytes."""
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes:
            return False
        now = time.monotonic()
        with self._lock:
            self._drop(key)
            self._drop_aged(now)
            while self._rows and self.held_bytes + size > self.max_bytes:
                self._drop(next(iter(self._rows)))
            self._rows[key] = (rows, tuple(ids), now)
            self.held_bytes += size
            self.num_put += 1
        return True

    def take(self, key: bytes, ids) -> torch.Tensor | None:
        """The rows of page `key`, no longer held, when they were read for these `ids` (a key
        names its ids, but a hit compares them, as the block manager's lookup does); None
        when none are held (or they aged out, or were read for other ids: dropped)."""
        with self._lock:
            self._drop_aged(time.monotonic())
            got = self._rows.get(key)
            if got is None:
                return None
            if got[1] != tuple(ids):
                self._drop(key)
                return None
            del self._rows[key]
            self.held_bytes -= got[0].numel() * got[0].element_size()
            self.num_taken += 1
            return got[0]

    def drop_aged(self) -> None:
        """Drop the rows held longer than max_age_s."""
        with self._lock:
            self._drop_aged(time.monotonic())

    def clear(self) -> None:
        with self._lock:
            for key in list(self._rows):
                self._drop(key)

    def counts(self) -> dict[str, int]:
        """num_put, num_taken, num_dropped, num_held, held_bytes."""
        with self._lock:
            return {"num_put": self.num_put, "num_taken": self.num_taken,
                    "num_dropped": self.num_dropped, "num_held": len(self._rows),
                    "held_bytes": self.held_bytes}

    def _drop(self, key: bytes) -> None:        # the lock held
        got = self._rows.pop(key, None)
        if got is not None:
            self.held_bytes -= got[0].numel() * got[0].element_size()
            self.num_dropped += 1

    def _drop_aged(self, now: float) -> None:   # the lock held; the oldest come first
        while self._rows:
            key, (_, _, at) = next(iter(self._rows.items()))
            if now - at <= self.max_age_s:
                return
            self._drop(key)
