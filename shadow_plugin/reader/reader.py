"""The reader: sessions fed turn by turn, read in whole grid chunks, rolled back on rewrites,
asked letter-choice questions in one forward, decoded greedily and summarised (those calls run
in a fork of a session: fork.py), saved to disk at a turn's end and marked stale before outputs
(the manifests). Forwards go through an adapter (adapters.Adapter); a session's memory
lives in the block store (block_store.SessionTable); the reader joins the two and keeps the ids.

Contract (docs/design.md): after any history of feeds, reads and asks, a session's committed
state equals a fresh prefill of ids[:C] on the same grid, bit for bit (`check_exact`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from adapters import Adapter, Qwen35, make_adapter
from block_store import SessionState, SessionTable, StoreConfig, compare, pack
from block_store.checkpoints import first_difference, resume, take
from block_store.memory.layout import clone_gdn
from block_store.session import check_layout, kv_view, release_state, state_bytes
from shadow_plugin import validate
from shadow_plugin.chat import questions
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader import exact, fork, lines, rewrites
from shadow_plugin.reader.conflicts import StaleSession
from shadow_plugin.reader.read_stats import ReadClock, ReadResult, ReadTotals
from shadow_plugin.reader.step import ReaderConfig, read_chunk, read_chunks
from shadow_plugin.reader.tails import Tails, base_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedResult:
    """first_difference: first position where a prompt differed from the held ids (None for
    output); rolled_back_from / rolled_back_to: C before and after a rollback (None when there
    was none); backlog: len(ids) - C after the feed; episode_start: the prompt ends a real user
    message; rewrite: None when the prompt extends the held ids, else its kind
    (rewrites.classify: 'bpe', 'template', or 'other' without a tokenizer that decodes
    them); durable: whether the session's manifest holding the prompt is on disk (None: no
    disk, or an output)."""

    first_difference: int | None
    rolled_back_from: int | None
    rolled_back_to: int | None
    backlog: int
    episode_start: bool = False
    rewrite: str | None = None
    durable: bool | None = None


def _no_collections() -> float:
    """The gc_ms clock of a reader given none: no collections counted (ms)."""
    return 0.0


@dataclass
class Check:
    """A check of a session's committed state in progress (Reader.begin_check): the session,
    its ids and C when it began (num_ids, committed), `state`: a snapshot of the session as
    it began (its ids[:C], references to its pages below C, a copy of its GDN states at C;
    not in the session table; emptied once given back), `fresh`: the fresh prefill of those
    ids."""

    session: str
    num_ids: int
    committed: int
    state: SessionState
    fresh: exact.FreshPrefill


class Reader:
    """Exact incremental reader over one model.

    Args: model (adapters.Qwen35, whose forwards adapters.make_adapter chooses from the
    options below, or an adapters.Adapter already built); grid (G, a multiple of 64, the
    page's rows; default 512, or the adapter's); max_checkpoints; tokenizer (an object
    with encode(text) -> ids; default: shadow_plugin.chat.tokenizer.load_tokenizer(), loaded on the
    first text question); resident_bytes (cap on resident session bytes, 4 GiB); disk_dir
    (where sessions past the cap are parked, block_store.disk.store; None: they are dropped and
    resumed from what memory still holds);
    disk_bytes (cap on the folder, None: none); disk_ttl_s (files older than this are
    deleted, 48 h); gdn_bytes (what unreferenced GDN table entries may keep; None: a quarter
    of resident_bytes); disk_shared (other servers use the folder: block_store.StoreConfig;
    `sync`), disk_grace_s (files younger than this, s, are never deleted; None: 60 with
    disk_shared, else 0); prefetch_bytes (page rows read ahead of restores, `prefetch`, may
    hold this much host memory; None: half of resident_bytes, at most 2 GiB); cuda_graphs,
    fused_ops, attn_split, attention, row_invariant: how the forwards run
    (adapters.make_adapter; refused with an adapter already built); max_tails: questions'
    tails kept (shadow_plugin.reader.tails: a page and a GDN state's bytes each; 0: none);
    gc_ms (a clock of the process's garbage collections, ms, as
    shadow_plugin.engine.gc_pauses.GcPauses.total_ms: the collections during a read are its
    difference, ReadResult.gc_ms; None: none counted).
    Questions, decoding and summaries: ask, generate, summarize.
    On CUDA with fla's kernels, construction runs the chunk runner's warm-up (its compiles
    and autotuning; `warm_up` does the rest): the page keys' identity covers the kernel picks
    a chunk's bits depend on (Adapter.identity).
    Raises ValueError for a bad grid, max_checkpoints, resident_bytes, gdn_bytes,
    prefetch_bytes or max_tails, an attention this device cannot run, or an attention,
    attn_split, fused_ops or row_invariant without the runners.
    """

    def __init__(self, model: Qwen35 | Adapter, grid: int | None = None,
                 max_checkpoints: int = 6, tokenizer=None, resident_bytes: int = 4 * 2**30,
                 disk_dir=None, disk_bytes: int | None = None, disk_ttl_s: float = 48 * 3600,
                 gdn_bytes: int | None = None, disk_shared: bool = False,
                 disk_grace_s: float | None = None, prefetch_bytes: int | None = None,
                 cuda_graphs: bool | None = None, fused_ops: bool | None = None,
                 attn_split=None, attention: str | None = None, max_tails: int = 8,
                 row_invariant: bool | None = None,
                 gc_ms: Callable[[], float] | None = None):
        options = (cuda_graphs, fused_ops, attn_split, attention, row_invariant)
        if isinstance(model, Adapter):
            if options != (None,) * 5 or grid not in (None, model.grid):
                raise ValueError(f"an adapter already chose its grid ({model.grid}) and how its "
                                 f"forwards run: pass grid, cuda_graphs, fused_ops, attn_split, "
                                 f"attention and row_invariant to the adapter, not the reader")
            self.config = ReaderConfig(model.grid, max_checkpoints)
            self.adapter = model
        else:
            self.config = ReaderConfig(512 if grid is None else grid, max_checkpoints)
            self.adapter = make_adapter(model, self.config.grid, *options)
        self.store_config = StoreConfig(resident_bytes, disk_dir, disk_bytes, disk_ttl_s,
                                        gdn_bytes, disk_shared, disk_grace_s, prefetch_bytes)
        self._tokenizer = tokenizer
        self._gc_ms = gc_ms or _no_collections
        self.totals = ReadTotals()          # read calls' ids, chunks and ms (read_stats)
        # questions' tails, by content (reader.tails): counted against the cap, and past it
        # given up before any session is parked
        self.tails = Tails(max_tails)
        self.table = SessionTable(self.adapter.spec, self.store_config,
                                  self.adapter.identity(), self.config.grid, self.tails)
        self._scratch: dict[str, fork.Scratch] = {}   # per session a fork base below C

    # -- sessions ------------------------------------------------------------------------------
    @property
    def model(self) -> Qwen35:
        """The weights the adapter runs (adapters.Qwen35)."""
        return self.adapter.model

    @property
    def path(self) -> str:
        """How chunks are read (the adapter's path tag): the committed bits depend on it, so
        spilled files carry it."""
        return self.adapter.path

    @property
    def store(self):
        """The page store the sessions share (block_store.PageStore: the KV pool, the GDN table,
        the disk tier, the counters)."""
        return self.table.store

    @property
    def num_resident(self) -> int:
        """Sessions whose states are in memory (the others parked on disk or dropped)."""
        return len(self.table.resident)

    def resident_states(self) -> list[SessionState]:
        """The states of the sessions in memory (block_store.SessionState: pages, GDN states at
        C, checkpoints), for reports that count what memory holds; not to be changed."""
        return list(self.table.resident.values())

    @property
    def has_disk(self) -> bool:
        """Whether a disk tier holds spilled sessions and pages (disk_dir was given)."""
        return self.store.disk is not None

    def _get(self, session) -> SessionState:
        """The session's state (SessionTable.get: restored from disk when parked, the most
        recently used). Raises ValueError for a bad session id, KeyError for an unknown one."""
        return self.table.get(validate.session_id(session))

    def _settle(self, session: str | None) -> None:
        """Keep resident bytes within the cap, sparing the session in use."""
        self.table.settle(session)

    def sessions(self) -> list[str]:
        """Resident session ids, most recently used first, then parked ones."""
        return self.table.names()

    def knows(self, session: str) -> bool:
        """Whether the session is held (resident, parked or on disk); restores nothing."""
        return self.table.knows(validate.session_id(session))

    def prefetch(self, session: str, prompt=None, before_read=None) -> int:
        """Read ahead, without the lock, the page files that restoring `session` (parked) or
        resuming `prompt` (ids of a session not held: a prefix on disk) would read under it
        (block_store.SessionTable.prefetch; `before_read()` is called before the first file
        is read), so the restore only copies rows into the pool.
        Best effort: returns the pages read, 0 for a resident session, without a disk, or
        when a read failed (the restore reads what is missing). Raises ValueError for a bad
        session id only."""
        sid = validate.session_id(session)
        try:
            return self.table.prefetch(sid, prompt, before_read)
        except Exception:                 # noqa: BLE001 (a read-ahead: the restore decides)
            log.debug("prefetch of session %r failed", sid, exc_info=True)
            return 0

    def drop(self, session: str) -> None:
        """Forget a session: its tensors, its record and its file. KeyError when unknown."""
        self.table.drop(validate.session_id(session))
        fork.drop_scratch(self.store, self._scratch.pop(session, None))
        self.tails.forget(session)

    def stats(self) -> dict:
        """Residency and counters (block_store.SessionTable.stats), each session also flagged
        `beyond_max_positions` when it holds more ids than the model's positions."""
        out = self.table.stats()
        out.update(self.tails.stats(), tail_bytes=self.tails.nbytes(self.store.pool.page_bytes))
        for s in out["sessions"].values():
            s["beyond_max_positions"] = s["num_ids"] > self.adapter.max_positions
        return out

    def close(self) -> None:
        """A planned stop: park every resident session (written to disk when there is one)."""
        for sid in list(self._scratch):
            fork.drop_scratch(self.store, self._scratch.pop(sid))
        self.tails.drop_all(self.store)
        self.table.close()

    def position(self, session: str) -> tuple[int, int]:
        """(ids held, C) of a resident or parked session without restoring it or making it
        the most recently used (what a scheduler looks at on every round). KeyError when
        unknown."""
        return self.table.position(validate.session_id(session))

    def holding(self, session: str) -> tuple[int, int, bool, int | None]:
        """(ids held, C, resident, manifest version) of a session, restoring nothing
        (block_store.SessionTable.holding). KeyError when unknown."""
        return self.table.holding(validate.session_id(session))

    def held_starts_with(self, session: str, ids) -> bool:
        """Whether the session's ids begin with `ids`, restoring nothing. KeyError when
        unknown."""
        return self.table.starts_with(validate.session_id(session), ids)

    def committed(self, session: str) -> int:
        """C, the committed length in ids (a multiple of the grid). KeyError when unknown."""
        return self._get(session).committed

    def backlog(self, session: str) -> int:
        """len(ids) - C, in ids. KeyError when unknown."""
        return self._get(session).backlog

    def ids(self, session: str) -> list[int]:
        """A copy of the session's ids, restoring nothing. KeyError when unknown."""
        held = self.table.held_ids(validate.session_id(session))
        return list(held) if isinstance(held, list) else held.tolist()

    def checkpoint_positions(self, session: str) -> list[int]:
        """Grid lines (ids) of the checkpoints held, ascending. KeyError when unknown."""
        return [cp.pos for cp in self._get(session).checkpoints]

    def state_bytes(self, session: str) -> int:
        """Bytes the session references (block_store.session.state_bytes: its pages, shared
        ones in full, its GDN states and entries). KeyError when unknown."""
        return state_bytes(self._get(session), self.store.pool.page_bytes)

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, session: str, ids, kind: str, episode_start: bool | None = None) -> FeedResult:
        """Give the reader a new turn's whole prompt (`kind="prompt"`) or ids the host produced
        (`kind="output"`, appended). A prompt that differs from the held ids at position d rolls
        back to the newest checkpoint at or below d (KV rows below stay), or to 0 without one.
        `episode_start` says whether the prompt ends a real user message (default: read from
        the ids). A prompt for an unknown session creates it, as it does for a session known
        only by a file the reader refuses (written by another path, model or grid, or damaged).

        Outputs first mark the session's manifest stale when they are the first since it was
        written (mark_outputs). A prompt re-synchronises a stale session.

        Raises ValueError for bad ids, kind or session id (nothing changes), KeyError for output
        to an unknown session, conflicts.StaleSession for output to a stale one (also one
        another server on a shared folder took on since: `sync`).
        """
        validate.session_id(session)
        validate.flag(episode_start, "episode_start")
        if kind not in ("prompt", "output"):
            raise ValueError(f"kind must be 'prompt' or 'output', got {kind!r}")
        new = validate.token_ids(ids, self.adapter.vocab_size)
        moved = self.table.sync(session)         # another server's newer manifest (shared)
        if kind == "output":
            st = self._get(session)
            if st.stale or moved:
                raise StaleSession(session, len(st.ids))
            self.mark_outputs(session)
            if self.table.resident.get(session) is not st:   # another server took it on
                raise StaleSession(session, len(self.table.held_ids(session)))
            st.ids.extend(new)
            return FeedResult(None, None, None, st.backlog)
        if not new:
            raise ValueError("a prompt must hold at least one id")
        if not self.table.knows(session):
            st = self.table.create(session)
        else:
            try:
                st = self.table.get(session)
            except KeyError:    # known only by a file the restore refused (another path, model,
                # grid, or damaged, set aside): the prompt starts the session again from 0
                st = self.table.create(session)
        behind = st.backlog >= self.config.grid          # a chunk or more unread as it began
        result = self._feed_prompt(st, new, episode_start)
        self.store.counters.turn_starts["false" if behind else "true"] += 1
        st.stale = False                         # the host's whole prompt: in step again
        saved = self.table.save(session)         # the manifest a restart trusts (with a disk)
        self._settle(session)
        return dataclasses.replace(result, durable=saved if self.has_disk else None)

    def _feed_prompt(self, st: SessionState, prompt: list[int], episode: bool | None) -> FeedResult:
        """Resume where the prompt can (block_store.checkpoints.resume: the deepest line whose
        pages are held and whose GDN states are known, its own below the first difference or
        another session's), hold the prompt, and hand down the checkpoint lines of its
        generation prompt (lines.prompt_line) and of its shared prefix (lines.shared_line) as
        positions."""
        d = first_difference(st.ids, prompt)
        before = st.committed
        kind = self._rewrite_kind(st.ids, prompt, d)
        resume(self.store, st, prompt, d, kind or "other")
        rolled = st.committed < before
        st.ids = prompt
        st.pending_lines = {p: e for p, e in st.pending_lines.items() if st.committed < p <= d}
        episode = lines.is_episode_start(prompt) if episode is None else bool(episode)
        line = lines.prompt_line(prompt, self.config.grid)
        store, cap = self.store, self.config.max_checkpoints
        if line == st.committed:
            take(store, st, episode, cap)
        elif line > st.committed:
            st.pending_lines[line] = episode or st.pending_lines.get(line, False)
        st.shared_line = lines.shared_line(prompt, self.config.grid)
        if st.shared_line and st.shared_line == st.committed:
            take(store, st, False, cap, kept=True)
        return FeedResult(d, before if rolled else None, st.committed if rolled else None,
                          st.backlog, episode, kind)

    def _rewrite_kind(self, held: list[int], prompt: list[int], d: int) -> str | None:
        """rewrites.classify with the reader's tokenizer ('other' when none loads)."""
        if d >= len(held):
            return None
        try:
            tok = self._tok()
        except Exception:                  # no tokenizer here: the cause stays unknown
            return "other"
        return rewrites.classify(held, prompt, d, tok)

    def warm_up(self, batch_sessions: int = 1) -> float:
        """Compile and capture the adapter's runners now (chunks, decode, question buckets,
        the states-keeping runners of every tail a fork can cut, fork.tail_rows, and with
        batch_sessions > 1 the batches of up to that many sessions' chunks that read_batch
        runs) instead of inside the first read, question or decode; returns the seconds it
        took (about 0 on the CPU or without graphs). Inside a serving process a capture at
        first use would sync the device and take graph memory after the host budgeted its
        own."""
        t0 = time.perf_counter()
        self.adapter.prepare(pool=self.store.pool, kept_rows=fork.tail_rows(self.config.grid),
                             chunk_batches=range(2, batch_sessions + 1))
        return time.perf_counter() - t0

    # -- reading -------------------------------------------------------------------------------
    def read(self, session: str | None = None, max_chunks: int | None = None) -> ReadResult:
        """Advance whole chunks only: the given session, or every resident session with a
        backlog of a chunk or more, most recently used first; at most `max_chunks` chunks in
        all. Returns ReadResult."""
        max_chunks = validate.count(max_chunks, "max_chunks")
        names = [session] if session is not None else [
            s for s in self.sessions() if s in self.table.resident]
        clock, n, forward_ms = ReadClock(self._gc_ms), 0, 0.0
        for name in names:
            st = self._get(name)
            before = n
            while st.backlog >= self.config.grid and (max_chunks is None or n < max_chunks):
                forward_ms += read_chunk(self.adapter, self.config, self.store, st)
                n += 1
            if n > before and st.backlog < self.config.grid and self.store_config.disk_shared:
                self.table.save(name)            # read up: its pages for another server
            self._settle(name)
        result = clock.result(n * self.config.grid, n, self.adapter.sync, forward_ms=forward_ms)
        self.totals.count(result)
        return result

    def read_batch(self, sessions) -> ReadResult:
        """One grid chunk of each of several sessions in one forward (step.read_chunks,
        adapter.read_chunks): each committed exactly as `read(session, max_chunks=1)` commits
        it alone, whatever else was in the batch. Sessions with less than a chunk of
        backlog (counted again once restored: a parked session may come back with more
        committed than its file told), given twice, or parked again by restoring a later one
        (a tight cap) are left out (the last one restored always stays, so each call reads at
        least one chunk when one is due); a chunk whose content another session of the batch
        reads now is left for the next call (its page is held then). Only the sessions due
        whose chunks one forward takes with the first's are read (Adapter.chunk_group: on the
        CUDA-graph adapter up to 8 at positions of one FA4 split count; with an adapter that
        reads one at a time, the first), so a call holds the device for one forward. On CUDA
        the graph adapter batches only sizes its warm-up checked: call
        `warm_up(batch_sessions=N)` first. Returns ReadResult with the sessions that advanced.
        Raises ValueError for a bad session id or `sessions` not a list of them (a string is
        not), KeyError for an unknown one (nothing read)."""
        names = list(dict.fromkeys(validate.session_id(s) for s in validate.items(
            sessions, "sessions must be a list of session ids")))
        clock, g = ReadClock(self._gc_ms), self.config.grid
        due = [n for n in names if self._backlog_held(n) >= g]
        if len(due) > 1:          # what one forward takes (one at a time: one chunk a call)
            due = [due[i] for i in self.adapter.chunk_group([self.table.position(n)[1]
                                                             for n in due])]
        pairs = [(name, self._get(name)) for name in due]      # restored when parked
        # still resident, and still a chunk due: a parked session's C (position: what its
        # file holds, 0 with none) may come back higher, its cached pages taken again
        pairs = [(n, st) for n, st in pairs
                 if self.table.resident.get(n) is st and st.backlog >= g]
        batched = (self.adapter.num_batched_forwards, self.adapter.num_batched_chunks)
        done, forward_ms = read_chunks(self.adapter, self.config, self.store,
                                       [st for _, st in pairs])
        advanced = tuple(n for n, st in pairs if any(st is d for d in done))
        for name, st in pairs:
            if st.backlog < g and self.store_config.disk_shared and name in advanced:
                self.table.save(name)            # read up: its pages for another server
        self._settle(advanced[0] if advanced else None)
        n = len(advanced)
        result = clock.result(n * g, n, self.adapter.sync, advanced, forward_ms)
        self.totals.count(result)
        # forwards of several sessions' chunks as the adapter ran them (a batch whose row
        # counts change the bits is read one at a time: adapters.eager)
        self.totals.count_batched(self.adapter.num_batched_forwards - batched[0],
                                  self.adapter.num_batched_chunks - batched[1])
        return result

    def _backlog_held(self, session: str) -> int:
        """len(ids) - C without restoring the session (Reader.position). KeyError when
        unknown."""
        n, c = self.table.position(session)
        return n - c

    # -- exactness -----------------------------------------------------------------------------
    def state_tensors(self, session: str) -> dict[str, torch.Tensor]:
        """name -> tensor of the committed state (block_store.state_names): KV rows [0, C)
        (copies gathered from the session's pages) and the GDN states after token C (views:
        clone before changing the session)."""
        st = self._get(session)
        check_layout(st, self.adapter.spec, self.config.grid)
        rows = kv_view(self.store, st).gather(st.committed)
        return pack(self.adapter.spec, rows, st.gdn, st.committed)

    def check_exact(self, session: str) -> bool:
        """Compare the committed state with a fresh prefill of ids[:C] on the same grid (run by
        exact.fresh_prefill's own loop, through the same adapter). Returns True; raises
        block_store.ExactnessError naming the first differing tensor and index, KeyError for
        an unknown session. The steps of begin_check, advance_check and finish_check in one
        call."""
        chk = self.begin_check(session)
        try:
            while self.advance_check(chk):
                pass
            return self.finish_check(chk)
        finally:
            self.cancel_check(chk)

    def begin_check(self, session: str) -> Check:
        """check_exact begun: the session as it is now (restored when parked) held in a
        snapshot (its ids[:C], references to its pages below C, a copy of its GDN states at
        C) and a fresh prefill of those ids, nothing read yet. `advance_check` reads the
        prefill a chunk at a time (a caller may let its lock go between two chunks: what
        happens to the session meanwhile changes nothing the check compares),
        `finish_check` compares, `cancel_check` gives the snapshot's pages back. KeyError for
        an unknown session."""
        st = self._get(session)
        check_layout(st, self.adapter.spec, self.config.grid)
        fresh = exact.begin_fresh(self.adapter, st.ids[:st.committed])   # may raise: first
        snap = SessionState(ids=fresh.ids, committed=st.committed,
                            pages=self.store.take_pages(st.pages), keys=list(st.keys),
                            gdn=clone_gdn(st.gdn), counted=False)
        return Check(session, len(st.ids), st.committed, snap, fresh)

    def advance_check(self, chk: Check) -> bool:
        """The check's next chunk of its fresh prefill (about one chunk's time); returns
        whether chunks are left."""
        more = exact.fresh_step(self.adapter, chk.fresh)
        self.adapter.sync()
        return more

    def finish_check(self, chk: Check) -> bool:
        """The check's comparison (its chunks left are read first): the snapshot's committed
        state against the fresh prefill, bit for bit. Returns True; raises ExactnessError as
        check_exact. The snapshot's pages are given back."""
        try:
            while exact.fresh_step(self.adapter, chk.fresh):
                pass
            want = exact.fresh_state(self.adapter, chk.fresh)
            snap = chk.state
            check_layout(snap, self.adapter.spec, self.config.grid)
            got = pack(self.adapter.spec, kv_view(self.store, snap).gather(snap.committed),
                       snap.gdn, snap.committed)
            compare(got, want)
            return True
        finally:
            self.cancel_check(chk)

    def cancel_check(self, chk: Check) -> None:
        """Give up a begun check: the snapshot's pages given back (once)."""
        release_state(self.store, chk.state)

    # -- forks: questions and generation -------------------------------------------------------
    def _tok(self):
        """Qwen3.5's tokenizer, loaded on first use (questions, summaries, rewrite kinds)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer()
        return self._tokenizer

    def ask(self, session: str, question, choices, at: int | None = None) -> questions.Answer:
        """Ask a letter-choice question about ids[:at] (default: all ids) in one forward.

        `question` is text (rendered as a user turn, questions.question_text) or a list of ids
        already rendered. Returns questions.Answer. Raises KeyError for an unknown session,
        ValueError for fewer than 2 or more than 26 choices, `at` beyond the ids, or bad ids.
        The same steps as begin_ask, advance and finish_ask, in one call.
        """
        pending = self.begin_ask(session, question, choices, at)
        try:
            while self.advance(pending):
                pass
            return self.finish_ask(pending)
        finally:
            self.cancel(pending)

    def begin_ask(self, session: str, question, choices, at: int | None = None) -> fork.Pending:
        """A question as `ask` takes it, begun: validated, rendered, its base brought to the
        grid line at or below `at` (chunks not read yet are read here) and its pages
        referenced. Then `advance` reads its ids in grid pieces (a caller may let its lock go
        between them: the fork holds what it needs, whatever happens to the session
        meanwhile) and `finish_ask` answers; `cancel` gives it up. Raises as `ask`."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        q_ids, letters, choices = self._question(st.ids, question, choices, at)
        fw = fork.start(self.adapter, self.config, self.store, st, session, q_ids, at,
                        fork.question_padding(self.adapter, at, len(q_ids)),
                        self._take_scratch(session, st, at), self.tails)
        return fork.Pending(fw, len(q_ids), letters=letters, choices=choices)

    def render_question(self, session: str, question, choices,
                        at: int | None = None) -> list[int]:
        """The question's ids as `begin_ask` renders them over the session's ids now (text as
        a user turn after ids[at - 1], ids checked), reading and restoring nothing: what a
        caller checks (the question, its length) before it reads toward `at`. Raises as
        `ask`."""
        held = self.table.held_ids(validate.session_id(session))
        return self._question(held, question, choices, validate.position(at, len(held)))[0]

    def render_questions(self, session: str, items, at: int | None = None) -> list[list[int]]:
        """render_question for each (question, choices) of items, as `begin_ask_many` renders
        them. Raises as `ask_many`."""
        held = self.table.held_ids(validate.session_id(session))
        at = validate.position(at, len(held))
        return [q_ids for q_ids, _, _ in questions.render_many(
            self._tok(), self.adapter.vocab_size, held, items, at)]

    def _question(self, ids, question, choices, at: int):
        """questions.render with this reader's tokenizer and vocabulary."""
        return questions.render(self._tok(), self.adapter.vocab_size, ids, question, choices,
                                at)

    def ask_many(self, session: str, items, at: int | None = None) -> list[questions.Answer]:
        """Several letter-choice questions about ids[:at] of one session in one forward
        (items: a sequence of (question, choices), each as `ask` takes them): forks sharing
        the session's pages and state at the grid line, their pieces and last forwards
        batched (Adapter.read_chunks, fork_logits_batch). Each Answer's probs are those `ask`
        gives the same question alone, bit for bit. Raises as `ask` (ValueError naming the
        item), ValueError for no items; nothing is held after a raise. The same steps as
        begin_ask_many, advance_many and finish_ask_many, in one call."""
        pendings = self.begin_ask_many(session, items, at)
        try:
            while self.advance_many(pendings):
                pass
            return self.finish_ask_many(pendings)
        finally:
            self.cancel_many(pendings)

    def begin_ask_many(self, session: str, items, at: int | None = None) -> list[fork.Pending]:
        """Several questions as `ask_many` takes them, begun: every item validated and
        rendered before anything is read, the base brought to the grid line at or below `at`
        once, then one fork a question (fork.start_many). Then `advance_many` reads their
        pieces in batches and `finish_ask_many` answers; `cancel_many` gives them up. Raises
        as `ask_many`."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        rendered = questions.render_many(self._tok(), self.adapter.vocab_size, st.ids, items,
                                         at)
        fws = fork.start_many(self.adapter, self.config, self.store, st, session,
                              [r[0] for r in rendered], at,
                              [fork.question_padding(self.adapter, at, len(r[0]))
                               for r in rendered], self._take_scratch(session, st, at),
                              self.tails)
        return [fork.Pending(fw, len(q), letters=lt, choices=ch)
                for fw, (q, lt, ch) in zip(fws, rendered)]

    def advance_many(self, pendings: list[fork.Pending]) -> bool:
        """One step of begun questions (begin_ask_many), one forward: the next whole chunk of
        each that has one, in one batch where the adapter batches them (Adapter.batches: the
        eager adapter; the graph adapter reads them one a step), else the next piece of one
        question; once no piece is left, where the adapter does not batch all their last
        forwards in one (the graph adapter: at one position, in one bucket or a mixed batch
        of theirs), the last forwards of one batch of questions at one position, or of one
        question, a step (fork.step_many, fork.last_group; where it batches them all, they
        run in `finish_ask_many`). Returns whether steps remain before `finish_ask_many`."""
        moved = fork.step_many(self.adapter, self.store, self.config.grid, pendings)
        if moved:
            self.adapter.sync()
        return moved

    def finish_ask_many(self, pendings: list[fork.Pending]) -> list[questions.Answer]:
        """The answers of begun questions, in order (their last forwards in one batch); their
        pages given back."""
        try:
            return fork.finish_answers(self.adapter, self.store, [p.fw for p in pendings],
                                       [p.letters for p in pendings],
                                       [p.choices for p in pendings],
                                       [p.logits for p in pendings])
        finally:
            self.cancel_many(pendings)
            if pendings:
                self._settle_known(pendings[0].fw.session)

    def cancel_many(self, pendings: list[fork.Pending]) -> None:
        """cancel for each."""
        for p in pendings:
            self.cancel(p)

    def advance(self, pending: fork.Pending, max_new_tokens: int = 8) -> bool:
        """One step of a begun question or decoding: its next grid piece, or (a decoding whose
        pieces are read) its prompt's last forward, or a burst of at most max_new_tokens ids.
        Returns whether steps remain before `finish_*`. A step never takes much longer than
        one chunk (or one burst)."""
        fw = pending.fw
        if fork.forward_piece(self.adapter, self.store, fw):
            self.adapter.sync()
            return True
        if pending.letters is not None:
            return False
        if pending.decoding is None:
            pending.decoding = fork.start_decoding(self.adapter, self.store, fw,
                                                   pending.max_new_tokens,
                                                   set(pending.stop_ids))
        else:
            fork.decode_burst(self.adapter, pending.decoding, max_new_tokens)
        return not pending.decoding.done

    def finish_ask(self, pending: fork.Pending) -> questions.Answer:
        """The answer of a begun question (its remaining steps run here); its pages given
        back."""
        try:
            return fork.finish_answer(self.adapter, self.store, pending.fw,
                                      pending.letters, pending.choices)
        finally:
            self.cancel(pending)
            self._settle_known(pending.fw.session)

    def cancel(self, pending: fork.Pending) -> None:
        """Give up a begun question or decoding: its pages given back (once; a finished one's
        already are)."""
        fork.release(self.store, pending.fw)

    def _settle_known(self, session: str) -> None:
        """_settle sparing the session, when it is still held (it may have gone between the
        steps of a fork)."""
        self._settle(session if session in self.table.resident else None)

    def make_tail(self, session: str) -> bool:
        """Forward and keep now the tail a question at the session's end forwards first
        (shadow_plugin.reader.tails: ids[line:cut] for at = its ids' length), when the
        session is resident (a parked one is not restored for it), its whole chunks are read
        (C is the grid line at or below its end), it has a tail (fork.tail_cut: a quarter of a
        grid or more past the line), the tail is not kept yet (a kept one becomes the session's
        tip tail too, Tails.claim) and its page fits under the resident cap, the session's
        older tip tail, which it replaces, counted as room (past the cap the tails are given
        up first: one made without room would go at the next settle, and be made again): for
        the idle window, so that the next question there
        forwards at most ROW_ALIGN - 1 of the session's ids besides its own. Returns whether a
        forward ran. Raises KeyError for an unknown session,
        ValueError for a bad session id."""
        sid = validate.session_id(session)
        st = self.table.resident.get(sid)
        if st is None:
            if not self.table.knows(sid):
                raise KeyError(sid)
            return False
        at, g = len(st.ids), self.config.grid
        line, cut = at // g * g, fork.tail_cut(at, g)
        if st.committed != line or cut == line or self.tails.max_tails == 0:
            return False
        key, ids = base_key(self.store, st.keys, line), st.ids[line:cut]
        if self.tails.has(key, ids):
            self.tails.claim(self.store, key, ids, sid)      # held: the session's tip too
            return False
        page_bytes = self.store.pool.page_bytes      # less its older tip's, which goes
        need = page_bytes + sum(c.nbytes + r.nbytes for c, r in st.gdn) - \
            self.tails.replaced_bytes(sid, page_bytes)
        if self.table.residency.resident_bytes(self.table.resident) + need > \
                self.store_config.resident_bytes:
            return False
        tail = fork.make_tail(self.adapter, self.store, st, line, ids, key)
        if not self.tails.keep(self.store, tail, owner=sid):
            self.store.manager.release(tail.page)
        self.adapter.sync()
        return True

    def prepare_fork(self, session: str, at: int, max_chunks: int = 1) -> int:
        """For a question or fork at `at` below C, which starts from a checkpoint and re-reads
        up to the grid line at or below `at` in scratch: read at most max_chunks (>= 1) of
        those chunks now, into a base kept for the session's next ask or generate at that line
        (one base a session, dropped when used, stale or the session is dropped; its pages
        are the session's own, found by key). Lets a server re-read a long way below C one
        chunk per hold of its lock. Returns the chunks read: 0 when the base is ready or
        `at` is at or above C. Raises KeyError for an unknown session, ValueError for a bad
        `at` or max_chunks."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        if not isinstance(max_chunks, int) or isinstance(max_chunks, bool) or max_chunks < 1:
            raise ValueError(f"max_chunks must be an integer >= 1, got {max_chunks!r}")
        line = at // self.config.grid * self.config.grid
        if at >= st.committed:
            return 0
        # taken out first: a read that raises gives the base back, and none stays behind
        sc, done = fork.advance_scratch(self.adapter, self.config, self.store, st,
                                        session, line, self._scratch.pop(session, None),
                                        max_chunks)
        self._scratch[session] = sc
        self.adapter.sync()
        return done

    def _take_scratch(self, session: str, st: SessionState, at: int):
        """The session's prepared base for a fork at `at` (then taken: the fork gives it back),
        or None (at or above C, none prepared, or stale: given back now)."""
        sc = self._scratch.pop(session, None)
        line = at // self.config.grid * self.config.grid
        if at < st.committed and fork.scratch_valid(sc, session, st, line):
            return sc
        fork.drop_scratch(self.store, sc)
        return None

    def generate(self, session: str, prompt, max_new_tokens: int = 64, at: int | None = None,
                 stop_ids=questions.STOP_IDS) -> fork.Generation:
        """Greedy decoding in a fork on top of ids[:at] (default: all ids) and `prompt`: an
        instruction text (rendered as a user turn plus the generation prompt, thinking off) or
        ids already rendered. Stops after `max_new_tokens` or at a stop id (<|im_end|>,
        <|endoftext|>). Nothing at or below C changes. Returns fork.Generation.
        Raises KeyError for an unknown session, ValueError for bad input. The same steps as
        begin_generate, advance and finish_generate, in one call."""
        pending = self.begin_generate(session, prompt, max_new_tokens, at, stop_ids)
        try:
            while self.advance(pending, max_new_tokens):
                pass
            return self.finish_generate(pending)
        finally:
            self.cancel(pending)

    def begin_generate(self, session: str, prompt, max_new_tokens: int = 64,
                       at: int | None = None, stop_ids=questions.STOP_IDS) -> fork.Pending:
        """A decoding as `generate` takes it, begun (as begin_ask: `advance` then forwards the
        prompt in pieces and decodes in bursts, `finish_generate` gives the Generation).
        Raises as `generate`."""
        st = self._get(session)
        at = validate.position(at, len(st.ids))
        if validate.count(max_new_tokens, "max_new_tokens") == 0:
            raise ValueError("max_new_tokens must be >= 1")
        p_ids = self._prompt(st.ids, prompt, at)
        fw = fork.start(self.adapter, self.config, self.store, st, session, p_ids, at,
                        max_new_tokens, self._take_scratch(session, st, at), self.tails)
        return fork.Pending(fw, len(p_ids), max_new_tokens=max_new_tokens,
                            stop_ids=frozenset(stop_ids))

    def render_prompt(self, session: str, prompt, at: int | None = None) -> list[int]:
        """The prompt's ids as `begin_generate` renders them over the session's ids now (text
        as a user turn after ids[at - 1] with the generation prompt, ids checked), reading
        and restoring nothing: what a caller checks before it reads toward `at`. Raises as
        `generate`."""
        held = self.table.held_ids(validate.session_id(session))
        return self._prompt(held, prompt, validate.position(at, len(held)))

    def _prompt(self, ids, prompt, at: int) -> list[int]:
        """questions.render_prompt with this reader's tokenizer and vocabulary."""
        return questions.render_prompt(self._tok(), self.adapter.vocab_size, ids, prompt, at)

    def finish_generate(self, pending: fork.Pending) -> fork.Generation:
        """The Generation of a begun decoding (its remaining steps run here); its pages given
        back."""
        try:
            while self.advance(pending, pending.max_new_tokens):
                pass
            return fork.generation(pending.decoding)
        finally:
            self.cancel(pending)
            self._settle_known(pending.fw.session)

    def summary_text(self, gen: fork.Generation) -> str:
        """A generation's ids as text, without the stop ids."""
        return self._tok().decode([i for i in gen.ids if i not in questions.STOP_IDS])

    def summarize(self, session: str,
                  instruction: str = "Summarize this session in a few sentences.",
                  max_tokens: int = 128,
                  at: int | None = None) -> tuple[str, fork.Generation]:
        """`generate` with an instruction; returns (text without the stop id, generation)."""
        gen = self.generate(session, instruction, max_tokens, at)
        return self.summary_text(gen), gen

    # -- files ---------------------------------------------------------------------------------
    def mark_outputs(self, session: str) -> bool | None:
        """Before the first outputs since the session's manifest was written, write it again
        marked stale (one write a turn), so a restart that finds it knows outputs came after
        it. Returns True when the disk's manifest says so (now or already), False when the
        write failed (logged, counted), None without a disk. Raises KeyError when unknown."""
        st = self._get(session)
        disk = self.store.disk
        if disk is None:
            return None
        if st.unsaved_outputs and disk.manifest_path(session).is_file():   # one stat: the
            return True                   # TTL may have swept an idle session's manifest
        return self.table.save(session, stale=True)

    def stale(self, session: str) -> bool:
        """Whether the session came back from a restart holding a prefix of what the host sent
        (until the host's next prompt), restoring nothing. KeyError when unknown."""
        st = self.table.resident.get(validate.session_id(session))
        if st is not None:
            return st.stale
        rec = self.table.residency.record(session)
        if rec is None:
            raise self.table.unknown(session)
        return rec.stale

    def sync(self, session: str) -> bool:
        """With a shared disk folder (disk_shared), whether the session's manifest on disk was
        written by another server since this reader last wrote or read it; then the copy held
        here is given back and the folder's version is restored on next use (one header
        read). False otherwise, and without a disk. Raises ValueError for a bad session id."""
        return self.table.sync(validate.session_id(session))

    def refresh_disk_listing(self) -> None:
        """List the disk folder for its counts when due (DiskStore.refresh), outside the
        reader's lock, so stats() under it does not list a large folder; nothing without a
        disk."""
        if self.store.disk is not None:
            self.store.disk.refresh()

    def refused(self, session: str) -> str | None:
        """Why the session's manifest was refused when the reader started (it is listed in
        stats()["refused_sessions"] until dropped or started again), None when it was not."""
        return self.table.residency.refused(validate.session_id(session))

    def save(self, session: str) -> bool:
        """Write the resident session's manifest (its ids, C, page and state keys,
        checkpoints) to the disk now, when the reader has one (a turn's end; a prompt writes
        its own): a restart resumes it at the deepest line whose pages and states are on disk.
        Returns whether the disk's manifest now holds all its ids: False without a disk or
        when the write failed (logged, counted in stats()["write_errors"]); for a parked
        session, whether its park wrote it. Raises ValueError for a bad session id, KeyError
        for an unknown one."""
        if not self.table.knows(validate.session_id(session)):
            raise KeyError(f"unknown session {session!r}")
        return self.table.save(session)
