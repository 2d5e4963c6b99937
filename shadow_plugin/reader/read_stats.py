"""What a read call took (Reader.read, Reader.read_batch) and the reader's running totals of it:
the call's wall time, its final wait for the device, its time in the adapter's forward calls,
its thread's CPU time and the process's garbage collections during it (docs/vllm.md reads
them to tell a slow read's cause: the host's thread held up, or the device's work).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ReadResult:
    """num_read_tokens: ids committed (num_chunks x G); ms: wall time including a device sync;
    sessions: (read_batch) the sessions that advanced a chunk, in order; sync_ms: of ms, the
    final wait for the device (Adapter.sync; about 0 on the CPU), the rest being the host's
    own part (launches, staging, restores, any blocking copy within); gc_ms: the process's
    garbage collections during it, ms (the reader's gc_ms clock; 0 without one); forward_ms:
    of ms, the host's time inside the adapter's forward calls (launches, staging, any wait
    for the device inside them; the rest of the host part is the reader's own bookkeeping:
    lookups, restores, commits, checkpoints, and any wait for the device there, which pays
    for the forward's GPU work still running); cpu_ms: the reading thread's CPU time over
    the host part (time.thread_time, ms): the host part less what the thread spent off the
    CPU, blocked (on the GIL, I/O, a device wait that blocks) or ready but not run (another
    thread or process had the core); a wait CUDA spins for counts as CPU, work of other
    threads (torch's intra-op pool, the spill's writers) does not."""

    num_read_tokens: int
    num_chunks: int
    ms: float
    sessions: tuple[str, ...] = ()
    sync_ms: float = 0.0
    gc_ms: float = 0.0
    forward_ms: float = 0.0
    cpu_ms: float = 0.0


class ReadClock:
    """A read call's clocks from its start: the wall (time.perf_counter), `gc_ms` (a clock of
    the process's garbage collections, ms) and the calling thread's CPU time
    (time.thread_time)."""

    def __init__(self, gc_ms: Callable[[], float]):
        self.gc_ms = gc_ms
        self.t0, self.gc0, self.cpu0 = time.perf_counter(), gc_ms(), time.thread_time()

    def result(self, num_read_tokens: int, num_chunks: int, sync: Callable[[], None],
               sessions: tuple[str, ...] = (), forward_ms: float = 0.0) -> ReadResult:
        """The call's ReadResult once `sync()` (its final wait for the device) has returned;
        forward_ms: its time in the adapter's forward calls."""
        t_sync, cpu_ms = time.perf_counter(), (time.thread_time() - self.cpu0) * 1e3
        sync()
        t1 = time.perf_counter()
        return ReadResult(num_read_tokens, num_chunks, (t1 - self.t0) * 1e3, sessions,
                          (t1 - t_sync) * 1e3, self.gc_ms() - self.gc0, forward_ms, cpu_ms)


class ReadTotals(dict):
    """Since start (a dict: status hands it out as it is): num_read_tokens, num_chunks and
    read_ms of every read call (reads that read nothing too); read_max_ms: the longest one
    call (a service's idle loop reads one chunk or one batched forward a call, under the lock:
    a host step's start waits for at most one); num_batched_forwards / num_batched_chunks:
    forwards that read chunks of two or more sessions at once (read_batch) and the chunks
    they read; read_sync_ms: of read_ms, the final waits for the device (ReadResult.sync_ms:
    the rest is the host's own part); read_host_max_ms / read_sync_max_ms: the longest host
    part of a call and the longest final wait, each the longest of its own; the longest
    call's own parts, taken together (server.ranks.LONGEST_READ): read_max_host_part_ms,
    read_max_gc_ms (collections during it), read_max_forward_ms (in the adapter's forward
    calls), read_max_num_chunks, read_max_cpu_ms (its thread's CPU time over its host part)
    and read_max_num_chunks_before (the chunks read before it; 0: it was the first read,
    which pays for what a first use costs). ms throughout."""

    def __init__(self):
        super().__init__(num_read_tokens=0, num_chunks=0, read_ms=0.0, read_sync_ms=0.0,
                         read_max_ms=0.0, read_host_max_ms=0.0, read_sync_max_ms=0.0,
                         read_max_host_part_ms=0.0, read_max_gc_ms=0.0,
                         read_max_forward_ms=0.0, read_max_num_chunks=0, read_max_cpu_ms=0.0,
                         read_max_num_chunks_before=0, num_batched_forwards=0,
                         num_batched_chunks=0)

    def count(self, result: ReadResult) -> None:
        """A read call's ids, chunks and ms."""
        host_part_ms = result.ms - result.sync_ms
        if result.ms > self["read_max_ms"]:
            self.update(read_max_ms=result.ms, read_max_host_part_ms=host_part_ms,
                        read_max_gc_ms=result.gc_ms, read_max_forward_ms=result.forward_ms,
                        read_max_num_chunks=result.num_chunks, read_max_cpu_ms=result.cpu_ms,
                        read_max_num_chunks_before=self["num_chunks"])
        self["num_read_tokens"] += result.num_read_tokens
        self["num_chunks"] += result.num_chunks
        self["read_ms"] += result.ms
        self["read_sync_ms"] += result.sync_ms
        self["read_host_max_ms"] = max(self["read_host_max_ms"], host_part_ms)
        self["read_sync_max_ms"] = max(self["read_sync_max_ms"], result.sync_ms)

    def count_batched(self, num_forwards: int, num_chunks: int) -> None:
        """Forwards of several sessions' chunks as the adapter ran them, and their chunks."""
        self["num_batched_forwards"] += num_forwards
        self["num_batched_chunks"] += num_chunks
