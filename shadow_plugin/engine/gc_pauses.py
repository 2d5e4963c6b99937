"""Python's garbage collections inside the serving engine's process, timed, and the shadow's
startup heap frozen (docs/vllm.md).

A collection stops whichever thread set it off, and, holding the GIL, every other thread of
the process: the host's step and the shadow's read alike. So a long read or a long wait at a
step's start may be a collection; status shows the longest beside them. A full collection
walks every object tracked and not frozen: vLLM's EngineCore freezes its startup heap
(vllm/v1/engine/core.py, `freeze_gc_heap`: collect, then `gc.freeze`, "to reduce GC overhead
from static objects during serving time") before the shadow loads, so the shadow's own
(its model, compiled kernels, CUDA graphs) would be walked by every full collection after;
`GcPauses.freeze_heap` freezes them once the shadow is up.
"""
from __future__ import annotations

import gc
import threading
import time


class GcPauses:
    """Times every collection through `gc.callbacks` (Python's hook: "start" and "stop" with
    the generation collected) while installed, in two spans: the shadow's start (from install
    to `freeze_heap`, once it is up: its model's load, warm-up and graphs' capture) and
    serving (since). Fields, serving (until freeze_heap: since install): num_pauses;
    pauses_ms (ms); max_ms, the longest one (ms), max_generation, its generation (0-2; -1
    before any), and max_thread, the name of the thread that set it off (a collection stops
    every thread all the same). The start's: num_startup_pauses, startup_pauses_ms (ms),
    startup_max_ms (ms). total_ms (ms): every pause since install, never reset: a clock to
    read the collections during a span (a wait, a hold) as its difference. frozen_objects:
    what freeze_heap froze. A pause's ms is an upper bound on the stall it caused:
    finalizers and weakref callbacks run inside it, and may let other threads run.
    Collections never nest (CPython's), and the fields are written with the GIL held, so no
    lock: a lock taken here could deadlock a `stats` call that a collection interrupts in
    its own thread."""

    def __init__(self):
        self.total_ms = 0.0
        self.num_pauses = 0
        self.pauses_ms = 0.0
        self.max_ms = 0.0
        self.max_generation = -1
        self.max_thread = ""
        self.num_startup_pauses = 0
        self.startup_pauses_ms = 0.0
        self.startup_max_ms = 0.0
        self.frozen_objects = 0
        self._began: float | None = None

    def install(self) -> "GcPauses":
        """Start timing (idempotent). Returns self."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)
        return self

    def remove(self) -> None:
        """Stop timing (idempotent); the fields keep what was timed."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def freeze_heap(self) -> int:
        """The shadow is up: collect the young generations (0 and 1: what was made since the
        last collections; a pause of the start, timed), then freeze every object still
        tracked (gc.freeze: later collections skip them), as vLLM's EngineCore does with its
        startup heap; the pauses timed so far become the start's (startup_*) and the serving
        fields start from zero. Without a full collection first, which would stop a host
        already serving for a walk of the whole heap: the older objects that were garbage
        then are kept (once; an object frozen is still freed when its last reference goes,
        only cycles stay). Returns the objects frozen now (also added to frozen_objects)."""
        gc.collect(1)
        before = gc.get_freeze_count()
        gc.freeze()
        frozen = gc.get_freeze_count() - before
        self.frozen_objects += frozen
        self.num_startup_pauses += self.num_pauses
        self.startup_pauses_ms += self.pauses_ms
        self.startup_max_ms = max(self.startup_max_ms, self.max_ms)
        self.num_pauses, self.pauses_ms, self.max_ms = 0, 0.0, 0.0
        self.max_generation, self.max_thread = -1, ""
        return frozen

    def _on_gc(self, phase: str, info: dict) -> None:
        # runs in the thread that set the collection off
        if phase == "start":
            self._began = time.perf_counter()
            return
        if self._began is None:           # installed mid-collection
            return
        ms = (time.perf_counter() - self._began) * 1e3
        self._began = None
        self.total_ms += ms
        self.num_pauses += 1
        self.pauses_ms += ms
        if ms > self.max_ms:
            self.max_ms, self.max_generation = ms, int(info.get("generation", -1))
            self.max_thread = threading.current_thread().name

    def stats(self) -> dict:
        """{"num_gc_pauses", "gc_pauses_ms", "gc_pause_max_ms", "gc_pause_max_generation",
        "gc_pause_max_thread" (serving), "num_gc_startup_pauses", "gc_startup_pauses_ms",
        "gc_startup_pause_max_ms" (the start), "gc_frozen_objects"}."""
        return {"num_gc_pauses": self.num_pauses, "gc_pauses_ms": self.pauses_ms,
                "gc_pause_max_ms": self.max_ms, "gc_pause_max_generation": self.max_generation,
                "gc_pause_max_thread": self.max_thread,
                "num_gc_startup_pauses": self.num_startup_pauses,
                "gc_startup_pauses_ms": self.startup_pauses_ms,
                "gc_startup_pause_max_ms": self.startup_max_ms,
                "gc_frozen_objects": self.frozen_objects}
