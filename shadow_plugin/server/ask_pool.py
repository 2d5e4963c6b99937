"""The questions' pool: at most `workers` questions (asks, summaries, checks) run at once, each
in a worker thread, and at most `queue` more wait for one; past that a question is refused at
once (Busy: 429 with Retry-After). So the memory questions take is bounded by the pool's size
times one question's scratch, whatever the number of clients. Waiting for the reader
(waits.Waits) happens before a question enters the pool and does not count against it.

While a question runs, its client is looked at every DISCONNECT_POLL_S: once it has gone, the
question's `cancelled` event is set, and the facade stops its catch-up reading at the next
chunk (facade_questions.QuestionCalls.catch_up) and skips its forward.
"""
from __future__ import annotations

import asyncio
import functools
import threading
from typing import Awaitable, Callable

import anyio
import anyio.to_thread

from .errors import Busy, ClientGone

DISCONNECT_POLL_S = 0.25


class AskPool:
    """Args: workers (>= 1): questions run at once; queue (>= 0): questions that may wait for a
    worker. Its counters (running + queued) are touched from the event loop only. Questions
    run in AnyIO's worker threads (under a limiter of `workers`), so a door that calls back
    into the event loop (vLLM's, anyio.from_thread) works from them."""

    def __init__(self, workers: int, queue: int):
        if workers < 1 or queue < 0:
            raise ValueError(f"the question pool needs workers >= 1 and queue >= 0, got "
                             f"{workers} and {queue}")
        self.workers, self.queue = workers, queue
        self._limiter: anyio.CapacityLimiter | None = None    # made in the event loop
        self.num_in = 0                   # questions running or queued
        self.num_refused = 0

    async def run(self, fn: Callable, *args,
                  disconnected: Callable[[], Awaitable[bool]] | None = None, **kwargs):
        """fn(*args, cancelled=event, **kwargs) in a worker; Busy when workers + queue are
        taken; ClientGone once `disconnected()` says the client left (the event is set, so
        fn stops at its next check; what it read stays; one not started yet never starts)."""
        if self.num_in >= self.workers + self.queue:
            self.num_refused += 1
            raise Busy(f"{self.num_in} questions are running or queued (SHADOW_ASK_WORKERS="
                       f"{self.workers}, SHADOW_ASK_QUEUE={self.queue}): try again shortly")
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.workers)
        cancelled = threading.Event()
        self.num_in += 1
        try:
            job = functools.partial(fn, *args, cancelled=cancelled, **kwargs)
            task = asyncio.ensure_future(anyio.to_thread.run_sync(job, limiter=self._limiter))
            while True:
                done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if done:
                    return task.result()
                if disconnected is not None and await disconnected():
                    cancelled.set()
                    task.cancel()             # waiting for a worker: never starts
                    task.add_done_callback(lambda t: t.cancelled() or t.exception())
                    raise ClientGone()
        finally:
            self.num_in -= 1

    def close(self) -> None:
        """Nothing to stop: the workers are AnyIO's (kept for the app's lifespan)."""
