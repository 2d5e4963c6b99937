"""The reader: sessions fed turn by turn, read in whole grid chunks, rolled back on rewrites,
asked letter-choice questions in one forward (those calls, which run in a fork of a session,
are in reader_forks.py).

Contract (DESIGN.md): after any history of feeds, reads and asks, a session's committed state
equals a fresh prefill of ids[:C] on the same grid, bit for bit (`check_exact`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import torch

from . import checkpoints, exact, fork, store, validate
from .model.runners import Runners
from .model.qwen35 import Qwen35
from .residency import Residency, StoreConfig
from .state import SessionState, check_layout, clone_gdn, new_state, state_bytes, zero_gdn
from .reader_forks import ForkCalls
from .step import ReaderConfig, read_chunk, sync, take_checkpoint


@dataclass(frozen=True)
class FeedResult:
    """first_difference: first position where a prompt differed from the held ids (None for
    output); rolled_back_from / rolled_back_to: C before and after a rollback (None when there
    was none); backlog: len(ids) - C after the feed; episode_start: the prompt ends a real user
    message."""

    first_difference: int | None
    rolled_back_from: int | None
    rolled_back_to: int | None
    backlog: int
    episode_start: bool = False


@dataclass(frozen=True)
class ReadResult:
    """num_read_tokens: ids committed (num_chunks x G); ms: wall time including a device sync."""

    num_read_tokens: int
    num_chunks: int
    ms: float


class Reader(ForkCalls):
    """Exact incremental reader over one model.

    Args: model (shadow_reader.model.Qwen35); grid (G, a multiple of 64); kv_step (KV growth in
    rows); max_checkpoints; tokenizer (an object with encode(text) -> ids; default:
    shadow_reader.tokenizer.load_tokenizer(), loaded on the first text question);
    resident_bytes (cap on resident session bytes, 4 GiB); disk_dir (where sessions past the
    cap are parked; None: they are dropped and read again from 0); disk_bytes (cap on the
    folder, None: none); disk_ttl_s (files older than this are deleted, 48 h); cuda_graphs
    (chunks, questions and decode steps through model.runners.Runners, CUDA graphs;
    default: on CUDA; on the CPU their bodies run without graphs); fused_ops (the runners'
    small ops through torch.compile, model.ops.fused_ops; default: on CUDA); attn_split (the
    runners' attention tiling, model.attn_triton.SplitConfig; setting it picks the table
    attention); attention (the runners' attention, model.graphs.ATTENTIONS; default: 'fa4' on
    Hopper where flash-attn-4 imports, else 'flash' on CUDA). Questions, decoding and
    summaries: reader_forks.ForkCalls.
    Raises ValueError for a bad grid, kv_step, max_checkpoints or resident_bytes, an
    attention this device cannot run, or an attention, attn_split or fused_ops without the
    runners.
    """

    def __init__(self, model: Qwen35, grid: int = 512, kv_step: int = 8192,
                 max_checkpoints: int = 6, tokenizer=None, resident_bytes: int = 4 * 2**30,
                 disk_dir=None, disk_bytes: int | None = None, disk_ttl_s: float = 48 * 3600,
                 cuda_graphs: bool | None = None, fused_ops: bool | None = None,
                 attn_split=None, attention: str | None = None):
        self.model = model
        if cuda_graphs is None:                 # on by default on CUDA
            cuda_graphs = model.device.type == "cuda"
        if not cuda_graphs and (attention, attn_split, fused_ops) != (None, None, None):
            raise ValueError(f"attention={attention!r}, attn_split={attn_split!r} and "
                             f"fused_ops={fused_ops!r} choose how the CUDA-graph runners work; "
                             f"with cuda_graphs off the reader reads through Qwen35.forward "
                             f"(SDPA): leave them unset")
        from .model.attn_triton import SplitConfig
        if attn_split is not None and not isinstance(attn_split, SplitConfig):
            raise ValueError(f"attn_split must be an attn_triton.SplitConfig (SplitConfig.parse"
                             f"('128x32x8x2')), got {type(attn_split).__name__}")
        self._graphs = (Runners(model, grid, attention, fused=fused_ops, split=attn_split)
                        if cuda_graphs else None)
        self.config = ReaderConfig(grid, kv_step, max_checkpoints)
        self.store_config = StoreConfig(resident_bytes, disk_dir, disk_bytes, disk_ttl_s)
        self._tokenizer = tokenizer
        self._sessions: dict[str, SessionState] = {}
        self._clock = 0
        self.totals = {"num_read_tokens": 0, "num_chunks": 0, "read_ms": 0.0}   # since start
        self._residency = Residency(self.store_config, model, grid, kv_step, self._identity())
        self._scratch: dict[str, fork.Scratch] = {}   # per session a fork base below C

    def _identity(self) -> store.FileIdentity:
        dev = self.model.device
        kind = f"cuda:{torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else dev.type
        return store.FileIdentity(self.model.info.fingerprint,
                                  json.dumps(self.model.cfg.to_dict(), sort_keys=True),
                                  self.config.grid, str(self.model.dtype).removeprefix("torch."),
                                  kind, f"{self.model.kernels.name} {self.path}")

    # -- sessions -------------------------------------------------------------------------------
    @property
    def path(self) -> str:
        """How chunks are read (model.runners.Runners.path, or 'eager' for Qwen35.forward): the
        committed bits depend on it, so spilled files carry it."""
        return self._graphs.path if self._graphs is not None else "eager"

    def _get(self, session) -> SessionState:
        """The session's state, restored from disk when parked; it becomes the most recently
        used, and after a restore the others are parked past the cap (the calls that grow a
        resident state settle after their work; settling on every call summed every session's
        bytes for each id a host streams). Raises KeyError for an unknown session."""
        validate.session_id(session)
        st = self._sessions.get(session)
        restored = st is None
        if restored:
            st = self._residency.restore(session)
            if st is None:
                raise KeyError(f"unknown session {session!r}")
            self._sessions[session] = st
        self._clock += 1
        st.last_used = self._clock
        if restored:
            self._settle(session)
        return st

    def _settle(self, session: str | None) -> None:
        """Keep resident bytes within the cap, sparing the session in use."""
        self._residency.make_room(self._sessions, session)

    def sessions(self) -> list[str]:
        """Resident session ids, most recently used first, then parked ones."""
        resident = sorted(self._sessions, key=lambda s: -self._sessions[s].last_used)
        return resident + [s for s in self._residency.parked if s not in self._sessions]

    def drop(self, session: str) -> None:
        """Forget a session: its tensors, its record and its file. KeyError when unknown."""
        validate.session_id(session)
        if session not in self._sessions and not self._residency.knows(session):
            raise KeyError(f"unknown session {session!r}")
        self._sessions.pop(session, None)
        self._residency.forget(session)
        self._scratch.pop(session, None)

    def stats(self) -> dict:
        """Residency and counters: see residency.Residency.stats."""
        return self._residency.stats(self._sessions)

    def close(self) -> None:
        """A planned stop: park every resident session (written to disk when there is one)."""
        self._residency.close(self._sessions)

    def position(self, session: str) -> tuple[int, int]:
        """(ids held, C) of a resident or parked session without restoring it or making it
        the most recently used (what a scheduler looks at on every round). KeyError when
        unknown."""
        validate.session_id(session)
        st = self._sessions.get(session)
        if st is not None:
            return len(st.ids), st.committed
        rec = self._residency.parked.get(session)
        if rec is None:
            raise KeyError(f"unknown session {session!r}")
        return len(rec.ids), rec.committed_on_disk

    def committed(self, session: str) -> int:
        """C, the committed length in ids (a multiple of the grid). KeyError when unknown."""
        return self._get(session).committed

    def backlog(self, session: str) -> int:
        """len(ids) - C, in ids. KeyError when unknown."""
        return self._get(session).backlog

    def ids(self, session: str) -> list[int]:
        """A copy of the session's ids. KeyError when unknown."""
        return list(self._get(session).ids)

    def checkpoint_positions(self, session: str) -> list[int]:
        """Grid lines (ids) of the checkpoints held, ascending. KeyError when unknown."""
        return [cp.pos for cp in self._get(session).checkpoints]

    def state_bytes(self, session: str) -> int:
        """Resident bytes of the session (state.state_bytes). KeyError when unknown."""
        return state_bytes(self._get(session))

    # -- feeding --------------------------------------------------------------------------------
    def feed(self, session: str, ids, kind: str, episode_start: bool | None = None) -> FeedResult:
        """Give the reader a new turn's whole prompt (`kind="prompt"`) or ids the host produced
        (`kind="output"`, appended). A prompt that differs from the held ids at position d rolls
        back to the newest checkpoint at or below d (KV rows below stay), or to 0 without one.
        `episode_start` says whether the prompt ends a real user message (default: read from
        the ids). A prompt for an unknown session creates it, as it does for a session known
        only by a file the reader refuses (written by another path, model or grid, or damaged).

        Raises ValueError for bad ids, kind or session id (nothing changes), KeyError for output
        to an unknown session.
        """
        validate.session_id(session)
        validate.flag(episode_start, "episode_start")
        if kind not in ("prompt", "output"):
            raise ValueError(f"kind must be 'prompt' or 'output', got {kind!r}")
        new = validate.token_ids(ids, self.model.cfg.vocab_size)
        if kind == "output":
            st = self._get(session)
            st.ids.extend(new)
            return FeedResult(None, None, None, st.backlog)
        if not new:
            raise ValueError("a prompt must hold at least one id")
        if session not in self._sessions and not self._residency.knows(session):
            self._sessions[session] = new_state(self.model.cfg, self.model.device, self.model.dtype)
        try:
            st = self._get(session)
        except KeyError:    # known only by a file the restore refused (another path, model,
            # grid, or damaged, set aside): the prompt starts the session again from 0
            self._sessions[session] = new_state(self.model.cfg, self.model.device,
                                                self.model.dtype)
            st = self._get(session)
        result = self._feed_prompt(st, new, episode_start)
        self._settle(session)
        return result

    def _feed_prompt(self, st: SessionState, prompt: list[int], episode: bool | None) -> FeedResult:
        grid = self.config.grid
        d = checkpoints.first_difference(st.ids, prompt)
        before = st.committed
        rolled = d < st.committed
        if rolled:
            cp = checkpoints.rollback_target(st.checkpoints, d)
            st.committed = cp.pos if cp else 0
            st.gdn = clone_gdn(cp.gdn) if cp else zero_gdn(self.model.cfg, self.model.device,
                                                          self.model.dtype)
            st.checkpoints = [c for c in st.checkpoints if c.pos <= d]
        st.ids = prompt
        st.pending_lines = {p: e for p, e in st.pending_lines.items() if st.committed < p <= d}
        episode = checkpoints.is_episode_start(prompt) if episode is None else bool(episode)
        line = checkpoints.prompt_line(prompt, grid)
        if line == st.committed:
            take_checkpoint(st, episode, self.config.max_checkpoints)
        elif line > st.committed:
            st.pending_lines[line] = episode or st.pending_lines.get(line, False)
        return FeedResult(d, before if rolled else None, st.committed if rolled else None,
                          st.backlog, episode)

    def warm_up(self) -> float:
        """Compile and capture the CUDA-graph runners now (chunks, decode, question buckets)
        instead of inside the first read, question or decode; returns the seconds it took
        (about 0 on the CPU or without graphs)."""
        t0 = time.perf_counter()
        if self._graphs is not None:
            self._graphs.prepare()
        return time.perf_counter() - t0

    # -- reading --------------------------------------------------------------------------------
    def read(self, session: str | None = None, max_chunks: int | None = None) -> ReadResult:
        """Advance whole chunks only: the given session, or every resident session with a
        backlog of a chunk or more, most recently used first; at most `max_chunks` chunks in
        all. Returns ReadResult."""
        max_chunks = validate.count(max_chunks, "max_chunks")
        names = [session] if session is not None else [
            s for s in self.sessions() if s in self._sessions]
        t0, n = time.perf_counter(), 0
        for name in names:
            st = self._get(name)
            while st.backlog >= self.config.grid and (max_chunks is None or n < max_chunks):
                read_chunk(self.model, self.config, st, self._graphs)
                n += 1
            self._settle(name)
        sync(self.model.device)
        result = ReadResult(n * self.config.grid, n, (time.perf_counter() - t0) * 1e3)
        self.totals["num_read_tokens"] += result.num_read_tokens
        self.totals["num_chunks"] += n
        self.totals["read_ms"] += result.ms
        return result

    # -- exactness ------------------------------------------------------------------------------
    def state_tensors(self, session: str) -> dict[str, torch.Tensor]:
        """name -> tensor of the committed state (exact.state_names): KV rows [0, C) and the
        GDN states after token C. Views, not copies: clone before changing the session."""
        st = self._get(session)
        check_layout(st, self.model.cfg)
        return exact.pack(self.model, st.kv, st.gdn, st.committed)

    def check_exact(self, session: str) -> bool:
        """Compare the committed state with a fresh prefill of ids[:C] on the same grid (run by
        exact.fresh_prefill's own loop, through the same chunk runner). Returns True; raises
        exact.ExactnessError naming the first differing tensor and index."""
        st = self._get(session)
        want = exact.fresh_prefill(self.model, st.ids[:st.committed], self.config.grid,
                                   self._graphs)
        exact.compare(self.state_tensors(session), want)
        return True
