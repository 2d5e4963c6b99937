"""The shadow inside a serving engine's process (vLLM's worker, rank 0): the service (model,
reader, host interface and facade: server.service.Service, loaded in a thread so the engine
never waits for it), the request events of each engine step applied at the step's start, the
in-turn ration in the per-step slot, the idle window in its own thread, calls from the engine's
API process, and a planned stop that writes the sessions.

The engine tells it three things a step (`StepInfo`); the bandwidth rule follows from when:
- `begin_step`: the engine is about to run the host's forward. The host is marked busy before
  the lock is taken, so the idle loop starts no chunk now and the host's step waits at most for
  the chunk in flight; then the events are applied (under the lock).
- `step_slot`: after the host's forward (vLLM: `wait_for_save`), the ration slice of each
  session whose request ran this step (Host.between_rounds: 2 % of the host's decode time).
- `end_step`: the host stays busy while the engine has requests; once it has none, the idle
  window opens.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field

import torch

from .config import ServiceConfig
from .follow import Follower, RequestEvent
from .server.remote import serve_call
from .server.service import Service

log = logging.getLogger(__name__)


def plain_mode(fn):
    """Run `fn` with torch's inference mode off: an engine runs its step under inference mode,
    and tensors the shadow made there (KV buffers grown in the per-step slot) could then not be
    updated by its idle thread, which runs outside it."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.inference_mode(False):
            return fn(*args, **kwargs)
    return run


@dataclass(frozen=True)
class StepInfo:
    """events: the request events since the last step, in order; running: the ids of the
    requests the step runs; has_requests: requests remain (running or waiting) after it."""

    events: tuple[RequestEvent, ...] = ()
    running: tuple[str, ...] = ()
    has_requests: bool = False


@dataclass
class EmbeddedShadow:
    """Args: cfg (the service's settings, SHADOW_* variables: ServiceConfig.from_env). Starts
    loading the model at once; events that come before it is ready wait, in order, and are
    applied when it is (also when the engine has gone idle meanwhile)."""

    cfg: ServiceConfig
    service: Service = field(init=False)
    _pending: list = field(default_factory=list)
    _follower: Follower | None = None
    _guard: threading.Lock = field(default_factory=threading.Lock)   # _pending, _follower
    _closed: bool = False

    def __post_init__(self) -> None:
        self.service = Service(self.cfg)
        self.service.start()
        threading.Thread(target=self._when_loaded, name="shadow-embedded-load",
                         daemon=True).start()

    def _when_loaded(self) -> None:
        if self.service.wait_loaded() == "ready":
            with self._guard:
                self._follower = Follower(self.service.shadow, self.cfg.grid)
            self._apply(())

    @plain_mode
    def _apply(self, events) -> None:
        """Queue `events` and, once the service is ready, apply every queued event in order
        under the one lock (a bad event is logged and skipped)."""
        with self._guard:
            self._pending.extend(events)
            if self._follower is None:
                return
            todo, self._pending = self._pending, []
            follower = self._follower
        if todo:
            with self.service.shadow.lock:
                try:
                    follower.apply(todo)
                except ValueError as e:
                    log.warning("shadow: request events skipped: %s", e)

    # -- the engine's step ----------------------------------------------------------------------
    def begin_step(self, info: StepInfo) -> None:
        self.service.busy = True           # before the lock: the idle loop starts no chunk now
        self._apply(info.events)

    @plain_mode
    def step_slot(self, info: StepInfo) -> None:
        """The ration slices of the sessions whose requests ran this step."""
        follower = self._follower
        if follower is None:
            return
        shadow = self.service.shadow
        for rid in info.running:
            session = follower.sessions.get(rid)
            if session is not None:
                try:
                    shadow.between_rounds(session)
                except KeyError:           # deleted meanwhile
                    pass

    def end_step(self, info: StepInfo) -> None:
        self.service.busy = info.has_requests

    # -- calls from the API process, and the stop -----------------------------------------------
    @plain_mode
    def call(self, name: str, kwargs: dict):
        """A call from the engine's API process (server.remote.serve_call's reply); status
        also names this process (pid) and the requests being followed; "stop" is `close`
        (the engine's front end calls it when a planned stop begins, before it stops the
        engine)."""
        if name == "stop":
            self.close()
            return ("ok", None)
        follower = self._follower
        extra = {"pid": os.getpid(), "embedded": True,
                 "followed_requests": dict(follower.sessions) if follower else {}}
        return serve_call(self.service, name, kwargs, extra)

    @plain_mode
    def close(self) -> None:
        """A planned stop: apply what is queued, stop the idle loop, write every resident
        session (with SHADOW_DISK set). Runs once."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
        if self.service.wait_loaded() == "ready":
            self._apply(())
        self.service.close()
