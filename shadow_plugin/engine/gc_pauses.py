"""Python's garbage collections inside the serving engine's process, timed (docs/vllm.md).

A collection stops whichever thread set it off, and, holding the GIL, every other thread of
the process: the host's step and the shadow's read alike. So a long read or a long wait at a
step's start may be a collection; status shows the longest beside them.
"""
from __future__ import annotations

import gc
import threading
import time


class GcPauses:
    """Times every collection through `gc.callbacks` (Python's hook: "start" and "stop" with
    the generation collected) while installed. Fields (summed since install): num_pauses;
    pauses_ms (ms); max_ms, the longest one (ms), and max_generation, its generation (0-2;
    -1 before any)."""

    def __init__(self):
        self.num_pauses = 0
        self.pauses_ms = 0.0
        self.max_ms = 0.0
        self.max_generation = -1
        self._began: float | None = None
        self._guard = threading.Lock()

    def install(self) -> "GcPauses":
        """Start timing (idempotent). Returns self."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def remove(self) -> None:
        """Stop timing (idempotent); the fields keep what was timed."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # runs in the thread that set the collection off, with the GIL held: no other thread
        # runs Python until "stop"; the guard only orders field updates with `stats`
        if phase == "start":
            self._began = time.perf_counter()
            return
        if self._began is None:           # installed mid-collection
            return
        ms = (time.perf_counter() - self._began) * 1e3
        self._began = None
        with self._guard:
            self.num_pauses += 1
            self.pauses_ms += ms
            if ms > self.max_ms:
                self.max_ms, self.max_generation = ms, int(info.get("generation", -1))

    def stats(self) -> dict:
        """{"num_gc_pauses", "gc_pauses_ms", "gc_pause_max_ms", "gc_pause_max_generation"}."""
        with self._guard:
            return {"num_gc_pauses": self.num_pauses, "gc_pauses_ms": self.pauses_ms,
                    "gc_pause_max_ms": self.max_ms,
                    "gc_pause_max_generation": self.max_generation}
