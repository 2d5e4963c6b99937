"""The questions' pool: at most `workers` questions (asks, summaries, checks) run at once, each
in a worker thread, and at most `queue` more wait for one; past that a question is refused at
once (Busy: 429 with Retry-After). So the memory questions take is bounded by the pool's size
times one question's scratch, whatever the number of clients. Waiting for the reader
(waits.Waits) happens before a question enters the pool and does not count against it.

While a question runs, its client is looked at every DISCONNECT_POLL_S: once it has gone, the
question's `cancelled` event is set, and the facade stops its catch-up reading at the next
chunk (facade.Shadow.catch_up) and skips its forward.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Awaitable, Callable

from shadow_plugin.server.errors import Busy, ClientGone

DISCONNECT_POLL_S = 0.25


class AskPool:
    """Args: workers (>= 1): questions run at once, in as many threads of the pool's own (so
    few threads touch the allocator: AnyIO's shared pool, up to 40 threads, let the process's
    memory creep by their allocator arenas); queue (>= 0): questions that may wait for a
    worker. Its counters are touched from the event loop only."""

    def __init__(self, workers: int, queue: int):
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None   # on first use
        self.resize(workers, queue)
        self.num_in = 0                   # questions running or queued

    def resize(self, workers: int, queue: int) -> None:
        """Set the sizes (before the first question: its threads start then). ValueError for
        workers < 1 or queue < 0; RuntimeError once a question has run."""
        if workers < 1 or queue < 0:
            raise ValueError(f"the question pool needs workers >= 1 and queue >= 0, got "
                             f"{workers} and {queue}")
        if self._executor is not None:
            raise RuntimeError("the question pool's threads have started: its size is fixed")
        self.workers, self.queue = workers, queue

    @property
    def full(self) -> bool:
        """True when a question now would be refused (Busy): workers and queue taken."""
        return self.num_in >= self.workers + self.queue

    @property
    def saturated(self) -> bool:
        """True when a question now would not start at once: every worker taken (it would
        wait in the queue, or be refused when that is full too)."""
        return self.num_in >= self.workers

    async def run(self, fn: Callable, *args,
                  disconnected: Callable[[], Awaitable[bool]] | None = None, **kwargs):
        """fn(*args, cancelled=event, **kwargs) in a worker; Busy when workers + queue are
        taken; ClientGone once `disconnected()` says the client left (the event is set, so
        fn stops at its next check; what it read stays; one not started yet never starts)."""
        if self.full:
            raise Busy(f"{self.num_in} questions are running or queued (SHADOW_ASK_WORKERS="
                       f"{self.workers}, SHADOW_ASK_QUEUE={self.queue}): try again shortly")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self.workers, "shadow-ask")
        cancelled = threading.Event()
        self.num_in += 1                  # until the job ends, even if its client left
        job = self._executor.submit(fn, *args, cancelled=cancelled, **kwargs)
        fut = asyncio.wrap_future(job)
        fut.add_done_callback(self._done)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
            if done:
                return fut.result()
            if disconnected is not None and await disconnected():
                cancelled.set()
                job.cancel()                  # waiting for a worker: never starts
                raise ClientGone()

    def _done(self, fut: asyncio.Future) -> None:
        self.num_in -= 1
        if not fut.cancelled():
            fut.exception()                   # seen: no "never retrieved" warning

    def close(self) -> None:
        """Stop the workers (queued questions are dropped); a later question starts new ones
        (an app's lifespan may run again, as in tests)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
