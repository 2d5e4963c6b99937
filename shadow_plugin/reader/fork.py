"""Forks: work on top of a session's state that leaves everything at or below C as it was.

A question's answer depends only on ids[:at] and the question (docs/design.md, "The contract"): the
forward always starts from the state at L = the grid line at or below `at`:
- at >= C: the reader first commits whole chunks up to L (so C == L), then forwards ids[L:at] and
  the question above C, into scratch pages from the pool (given back after), and drops the GDN
  states it returns;
- at < C: a scratch state starts from the newest checkpoint at or below L (or from 0) sharing
  the session's pages below it, reads forward to L (its pages are the session's own, found by
  key), and forwards the rest there; the session never sees it.
Both paths give the same bits: the same ids on the same grid from equal states.

From the line a fork forwards (every forward starts at a multiple of ROW_ALIGN, 64 rows):
1. the tail ids[line:cut], cut = at // ROW_ALIGN * ROW_ALIGN when that holds a quarter of a
   grid or more (`tail_cut`; else none), as a forward of its own that keeps its states
   (Adapter.read_rows); what it gives depends only on ids[:cut], so the reader keeps it
   (reader.tails) and a question at the same place starts from it (each fork a copy of its
   page);
2. while more than a grid's ids are left: a piece up to the next grid line (read_rows from
   cut, then whole chunks, Adapter.read_chunk), each keeping its states;
3. the last forward (1 to grid ids): a question's letters' logits, or a prompt's first id.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from adapters import ROW_ALIGN, Adapter
from block_store import PagedKv, PageStore, SessionState
from block_store.checkpoints import rollback_target
from block_store.memory.layout import GdnState
from block_store.memory.pool import Page
from block_store.session import release_state, scratch_from
from shadow_plugin.chat.questions import Answer
from shadow_plugin.reader.step import ReaderConfig, read_chunk
from shadow_plugin.reader.tails import Tail, Tails, base_key


@dataclass
class Scratch:
    """A scratch base read toward grid line `line` of `session` over several calls (so a long
    re-read below C need not hold the reader for its whole length): state (its pages
    referenced: give them back with `drop_scratch`) and the ids it reads in all (num_scratch).
    Valid while the session's ids below `line` equal state.ids."""

    session: str
    line: int
    state: SessionState
    num_scratch: int


def new_scratch(store: PageStore, st: SessionState, session: str, line: int) -> Scratch:
    """A base at the newest checkpoint at or below `line` (or 0)."""
    base = scratch_from(store, st, rollback_target(st.checkpoints, line), line)
    return Scratch(session, line, base, line - base.committed)


def drop_scratch(store: PageStore, sc: Scratch | None) -> None:
    if sc is not None:
        release_state(store, sc.state)


def scratch_valid(sc: Scratch | None, session: str, st: SessionState, line: int) -> bool:
    """Whether sc is a base toward `line` of this session whose ids still equal the session's
    below the line (then its pages and states do too)."""
    return sc is not None and sc.session == session and sc.line == line \
        and sc.state.ids == st.ids[:line]


def advance_scratch(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
                    session: str, line: int, sc: Scratch | None,
                    max_chunks: int) -> tuple[Scratch, int]:
    """Read at most max_chunks chunks of the scratch base toward `line` (< C), starting one
    at the newest checkpoint when sc is not valid for it (an invalid one is given back).
    Returns (the base, chunks read)."""
    if not scratch_valid(sc, session, st, line):
        drop_scratch(store, sc)
        sc = new_scratch(store, st, session, line)
    done = 0
    try:
        while sc.state.committed < line and done < max_chunks:
            read_chunk(adapter, rcfg, store, sc.state)
            done += 1
    except BaseException:                  # a failed read: the base goes, its pages back
        drop_scratch(store, sc)
        raise
    return sc, done


def fork_base(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
              at: int, scratch: Scratch | None = None) -> tuple[Scratch | None, int, int, int]:
    """Bring a fork's base to the grid line L at or below `at` (see the module doc); whole
    chunks go through the adapter's chunk forward (so they give the bits reads give).
    Returns (the scratch base below C, or None when the base is the session itself; L; ids
    committed on the way; ids read in scratch). scratch: a base already (partly) read toward
    L below C, checked valid by the caller. The caller gives the scratch base back (when a
    read raises, it is given back here)."""
    line = at // rcfg.grid * rcfg.grid
    if at >= st.committed:
        num_committed = line - st.committed
        while st.committed < line:
            read_chunk(adapter, rcfg, store, st)
        return None, line, num_committed, 0
    sc = scratch if scratch is not None else new_scratch(store, st, "", line)
    try:
        while sc.state.committed < line:
            read_chunk(adapter, rcfg, store, sc.state)
    except BaseException:                  # a failed read: the base goes, its pages back
        drop_scratch(store, sc)
        raise
    return sc, line, 0, sc.num_scratch


@dataclass
class Forward:
    """A fork's forward in progress, read in grid pieces so that a caller may let its lock go
    between them (the reader's `start_*` / `forward_piece` / `finish_*`). It holds its own
    references to the base's pages below `line` and to its scratch pages above (`pages`: give
    them back with `release`), and its GDN states, so what happens to the session between
    two pieces (reads, a rewrite, a park) changes nothing it computes: its result depends
    only on the ids it started with. pinned: the base's pages below `line`; scratch: the
    pages above it taken so far (one more as each piece needs it, `kv`); rows: the rows its
    forwards need in all, its last forward's padding and a decode's tokens included.

    at: the position forked at; line: the grid line at or below `at` the forward starts
    from; pos: the row the next piece starts at (a grid line until the last piece); rest:
    the ids still to forward (the session's ids[line:at], then the question or prompt);
    gdn: the states after row pos - 1; num_ids: ids[line:at] + the question, in ids;
    num_committed / num_scratch: ids the session committed / a scratch base read first;
    backlog: len(ids) - C when it started; t0: time.perf_counter() at its start; end: the
    position after its last id (at + the question's or prompt's ids), whatever it forwards
    (a fork on a kept tail forwards fewer ids: num_ids); base_rows: its KV rows
    [0, base_rows) are its base's (the pages below `line`, its copy of the tail's page):
    the same in every fork of one start_many, which share one `origin` (an object of that
    call's own: forks of two calls may stand on other rows at the same place, a rewrite
    between them)."""

    session: str
    at: int
    line: int
    pos: int
    rest: list[int]
    gdn: GdnState
    pinned: list[Page]
    scratch: list[Page]
    rows: int
    num_ids: int
    num_committed: int
    num_scratch: int
    backlog: int
    t0: float
    stale: bool = False
    end: int = 0
    base_rows: int = 0
    origin: object = None


def min_tail(grid: int) -> int:
    """The fewest ids tail_cut cuts as a tail: a quarter of the grid, rounded up to a multiple
    of ROW_ALIGN (128 at grid 512, 64 at 256 and at 128). On an H100 (0.8B, FA4) the router
    question (172 ids) on a kept 128-id tail took 0.67 of one forward at 100,352 ids (4.64
    against 6.91 ms) and 0.74 at 32,768, while a kept 64-id tail saved nothing (one forward of
    236 rows falls in the question's own 256-row bucket: 4.97 ms both;
    docs/tail-bench-h100-2026-12-05-b.log)."""
    return -(-(grid // 4) // ROW_ALIGN) * ROW_ALIGN


def tail_cut(at: int, grid: int) -> int:
    """Where a fork at `at` cuts its tail: the multiple of ROW_ALIGN at or below `at` when the
    tail from the grid line holds min_tail(grid) ids or more, else the line (no tail: a
    shorter one goes with the question). A function of `at` and the grid only: a fork's bits
    never depend on what was kept."""
    line, cut = at // grid * grid, at // ROW_ALIGN * ROW_ALIGN
    return cut if cut - line >= min_tail(grid) else line


def tail_rows(grid: int) -> list[int]:
    """The row counts of every tail tail_cut can cut at this grid (multiples of ROW_ALIGN
    from min_tail(grid) to the grid less ROW_ALIGN: 128, 192, ..., 448 at grid 512), for the
    warm-up to capture their runners (Adapter.prepare's kept_rows)."""
    return list(range(min_tail(grid), grid, ROW_ALIGN))


def piece_len(pos: int, num_rest: int, grid: int) -> int:
    """Ids of the next piece of a fork at row `pos` (past its tail) with num_rest ids left: up
    to the next grid line while more than a grid's ids are left (a whole chunk at a grid
    line), 0 when the rest is its last forward."""
    return 0 if num_rest <= grid else grid - pos % grid


def num_pieces(at: int, num_extra_ids: int, grid: int) -> tuple[int, int]:
    """(pieces, ids of the last forward) of a fork at `at` with num_extra_ids ids of its own:
    the pieces read after its tail (forward_piece), then its last forward of 1 to grid ids."""
    pos = tail_cut(at, grid)
    n, count = at - pos + num_extra_ids, 0
    while (step := piece_len(pos, n, grid)):
        pos, n, count = pos + step, n - step, count + 1
    return count, n


def question_padding(adapter: Adapter, at: int, num_question_ids: int) -> int:
    """Rows a question's last forward pads past its ids (adapter.fork_rows of what is left
    after its tail and pieces), for `start`'s extra_rows."""
    last = num_pieces(at, num_question_ids, adapter.grid)[1]
    return adapter.fork_rows(last) - last


def start(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
          session: str, extra_ids: list[int], at: int, extra_rows: int,
          scratch: Scratch | None = None, tails: Tails | None = None) -> Forward:
    """Begin a fork at `at` with `extra_ids` (a question or a prompt) after ids[line:at]:
    fork_base brings the base to the grid line (chunks it must read are read here: a caller
    that must not hold its lock that long reads them first, Reader.prepare_fork and read),
    the tail ids[line:cut] is found in `tails` or forwarded (and kept there), then the fork
    takes references to the base's pages (its scratch pages come as its pieces need them,
    `kv`, for its ids and `extra_rows` more: its last forward's padding, a decode's tokens).
    The scratch base, if any, is given back at once (the fork holds what it needs). Raises
    as fork_base."""
    return start_many(adapter, rcfg, store, st, session, [extra_ids], at, [extra_rows],
                      scratch, tails)[0]


def start_many(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
               session: str, extra_ids: list[list[int]], at: int, extra_rows: list[int],
               scratch: Scratch | None = None, tails: Tails | None = None) -> list[Forward]:
    """`start` for several forks at one `at` over one base (several questions over one
    session): the base brought to the grid line once and the tail forwarded at most once,
    then each fork its own references to the base's pages below the line, its own copy of
    the tail's page and the tail's GDN states (shared: no forward changes a state in place),
    its other scratch pages its own. A fork gives each the bits it gets started alone, with
    its tail kept or not. Raises as fork_base (no fork is held then)."""
    t0 = time.perf_counter()
    backlog = st.backlog
    sc, line, num_committed, num_scratch = fork_base(adapter, rcfg, store, st, at, scratch)
    base = sc.state if sc else st
    cut = tail_cut(at, rcfg.grid)           # the line when there is no tail
    out: list[Forward] = []
    tail, num_tail, origin = None, 0, object()
    try:
        if cut > line:
            # at the session's end: its tip tail (replacing its older one in `tails`)
            owner = session if at == len(st.ids) else None
            tail, num_tail = tail_of(adapter, store, base, line, st.ids[line:cut], tails,
                                     owner)
        for extra, rows in zip(extra_ids, extra_rows):
            fwd = st.ids[line:at] + list(extra)
            pinned = store.take_pages(base.pages[:line // rcfg.grid])
            fw = Forward(session, at, line, line, fwd, base.gdn, pinned, [],
                         line + len(fwd) + rows, len(fwd), num_committed, num_scratch,
                         backlog, t0, st.stale, at + len(extra), line, origin)
            out.append(fw)
            if tail is not None:       # the fork starts at cut, on its own copy of the page
                fw.scratch.append(store.copy(tail.page))
                fw.pos, fw.rest, fw.gdn, fw.base_rows = cut, fwd[cut - line:], tail.gdn, cut
                fw.num_ids = len(fw.rest) + num_tail
    except BaseException:
        for fw in out:
            release(store, fw)
        raise
    finally:
        drop_scratch(store, sc)
        if tail is not None and (tails is None or not tails.holds(tail)):
            store.manager.release(tail.page)       # not kept: the forks hold copies
    return out


def tail_of(adapter: Adapter, store: PageStore, base: SessionState, line: int, ids: list[int],
            tails: Tails | None, owner: str | None = None) -> tuple[Tail, int]:
    """The tail ids = ids[line:cut] over `base` (its state at the grid line, C == line):
    found in `tails`, or forwarded now into a page of its own (Adapter.read_rows) and kept
    there (when tails keep any; owner: the session whose tip tail it is, Tails.keep, or
    Tails.claim when found). Returns (the tail, ids forwarded: 0 when found). The caller
    gives its page back unless `tails` holds it. Raises PoolFull when no page can be had,
    and what the forward raises (its page given back)."""
    key = base_key(store, base.keys, line)
    if tails is not None and (tail := tails.find(key, ids)) is not None:
        if owner is not None:
            tails.claim(store, key, ids, owner)
        return tail, 0
    tail = make_tail(adapter, store, base, line, ids, key)
    if tails is not None:
        tails.keep(store, tail, owner)
    return tail, len(ids)


def make_tail(adapter: Adapter, store: PageStore, base: SessionState, line: int,
              ids: list[int], key: bytes) -> Tail:
    """Forward ids (ids[line:cut]) at the line over `base` (C == line) into a new page:
    the Tail (its page's one reference the caller's). Raises PoolFull, and what the forward
    raises (the page given back then)."""
    page = store.allocate()
    try:
        gdn = adapter.read_rows(ids, line, store.view(base.pages[:line // store.grid], [page]),
                                base.gdn)
    except BaseException:
        store.manager.release(page)
        raise
    return Tail(key, line, tuple(ids), page, gdn)


def kv(store: PageStore, fw: Forward, rows: int) -> PagedKv:
    """The fork's KV with scratch pages for rows [line, rows) at least (taken now as needed:
    a pool that must grow grows a little at a time, not by a whole question at once)."""
    while len(fw.pinned) + len(fw.scratch) < -(-rows // store.grid):
        fw.scratch.append(store.allocate())
    return store.view(fw.pinned, fw.scratch)


def forward_piece(adapter: Adapter, store: PageStore, fw: Forward) -> bool:
    """Read the fork's next piece when one is due (piece_len): a whole chunk at a grid line
    (adapter.read_chunk), else the piece from its cut up to the grid line
    (adapter.read_rows); KV rows into its scratch pages, the states kept in `fw`. Returns
    whether one was read. Raises PoolFull when no page can be had (release fw then)."""
    n = piece_len(fw.pos, len(fw.rest), adapter.grid)
    if n == 0:
        return False
    read = adapter.read_chunk if n == adapter.grid else adapter.read_rows
    fw.gdn = read(fw.rest[:n], fw.pos, kv(store, fw, fw.pos + n), fw.gdn)
    fw.pos += n
    fw.rest = fw.rest[n:]
    return True


def forward_pieces(adapter: Adapter, store: PageStore, fws: list[Forward]) -> bool:
    """forward_piece for every fork that has a piece due: the whole chunks in one
    adapter.read_chunks (each with the bits forward_piece gives it), a piece up to a grid
    line each alone; returns whether one was read. Raises PoolFull when no page can be had
    (release the forks then)."""
    g = adapter.grid
    due = [fw for fw in fws if piece_len(fw.pos, len(fw.rest), g) > 0]
    chunks = [fw for fw in due if piece_len(fw.pos, len(fw.rest), g) == g]
    for fw in due:
        if all(fw is not c for c in chunks):
            forward_piece(adapter, store, fw)
    if chunks:
        items = [(fw.rest[:g], fw.pos, kv(store, fw, fw.pos + g), fw.gdn) for fw in chunks]
        for fw, gdn in zip(chunks, adapter.read_chunks(items)):
            fw.gdn = gdn
            fw.pos += g
            fw.rest = fw.rest[g:]
    return bool(due)


def release(store: PageStore, fw: Forward) -> None:
    """Give back the fork's page references (once; later calls do nothing)."""
    pages = fw.pinned + fw.scratch
    fw.pinned, fw.scratch = [], []
    store.release_pages(pages)


def finish_answer(adapter: Adapter, store: PageStore, fw: Forward, letters: list[int],
                  choices: list[str]) -> Answer:
    """The fork's last forward (its pieces read: the rest through adapter.fork_logits) and the
    Answer: probs the softmax (fp32) over the letters' logits. The caller releases fw."""
    while forward_piece(adapter, store, fw):   # pieces the caller left: read them now
        pass
    logits = adapter.fork_logits(fw.rest, fw.pos, kv(store, fw, fw.rows), fw.gdn, letters)
    return to_answer(adapter, fw, logits, choices)


def finish_answers(adapter: Adapter, store: PageStore, fws: list[Forward],
                   letters: list[list[int]], choices: list[list[str]],
                   logits: list[torch.Tensor | None] | None = None) -> list[Answer]:
    """finish_answer for several forks: their pieces left in batches (forward_pieces), their
    last forwards in one last_logits_many (those whose `logits` were not computed
    already); each Answer as finish_answer gives it alone (bit for bit in its
    logits). The caller releases the forks."""
    while forward_pieces(adapter, store, fws):
        pass
    logits = list(logits or [None] * len(fws))
    todo = [i for i, lg in enumerate(logits) if lg is None]
    got = last_logits_many(adapter, store, [fws[i] for i in todo],
                           [letters[i] for i in todo]) if todo else []
    for i, lg in zip(todo, got):
        logits[i] = lg
    return [to_answer(adapter, fw, lg, ch) for fw, lg, ch in zip(fws, logits, choices)]


def last_logits(adapter: Adapter, store: PageStore, fw: Forward,
                letters: list[int]) -> torch.Tensor:
    """A fork's last forward alone (its pieces read): its letters' logits, what
    finish_answers would compute for it."""
    return adapter.fork_logits(fw.rest, fw.pos, kv(store, fw, fw.rows), fw.gdn, letters)


def last_logits_many(adapter: Adapter, store: PageStore, fws: list[Forward],
                     letters: list[list[int]]) -> list[torch.Tensor]:
    """Forks' last forwards (their pieces read) through adapter.fork_logits_batch (one forward a
    group at one position, in one bucket or a mixed batch of several, on the graph adapter,
    which may read the rows they share once: their base's, when all come from one start_many
    (one origin), as the forks of one ask do): fork i's letters' logits [len(letters[i])] fp32,
    the bits last_logits gives it alone."""
    if not fws:
        return []
    return adapter.fork_logits_batch([(fw.rest, fw.pos, kv(store, fw, fw.rows), fw.gdn, lt)
                                      for fw, lt in zip(fws, letters)],
                                     shared_rows=shared_rows(fws))


def shared_rows(fws: list[Forward]) -> int:
    """The KV rows [0, n) that every fork holds the same: their base's rows (base_rows) when
    all come from one start_many (one origin), as the forks of one ask do; else 0."""
    one_base = all(fw.origin is fws[0].origin and fw.base_rows == fws[0].base_rows
                   for fw in fws) and fws[0].origin is not None
    return fws[0].base_rows if one_base else 0


def step_many(adapter: Adapter, store: PageStore, grid: int, pendings: list[Pending]) -> bool:
    """One step of begun questions, one forward (Reader.advance_many, which syncs after it):
    the next whole chunk of each that has one, in one batch where the adapter batches them
    (forward_pieces), else the next piece of one question (forward_piece); once no piece is
    left and the adapter does not batch all their last forwards in one (Adapter.batches with
    their positions and shared rows), the last forwards of `last_group`, their logits into
    the pendings. Returns whether a step ran that leaves steps before finish_answers."""
    fws = [p.fw for p in pendings]
    due = [n for fw in fws if (n := piece_len(fw.pos, len(fw.rest), grid))]
    if due:
        if all(n == grid for n in due) and adapter.batches(due):
            return forward_pieces(adapter, store, fws)
        return any(forward_piece(adapter, store, fw) for fw in fws)
    if len(pendings) < 2 or adapter.batches([len(fw.rest) for fw in fws],
                                            [fw.pos for fw in fws], shared_rows(fws)):
        return False                          # all in one forward: finish_answers runs it
    group = last_group(adapter, [p for p in pendings if p.logits is None])
    if group:
        got = last_logits_many(adapter, store, [p.fw for p in group],
                               [p.letters for p in group])
        for p, logits in zip(group, got):
            p.logits = logits
    return any(p.logits is None for p in pendings)


def last_group(adapter: Adapter, todo: list[Pending]) -> list[Pending]:
    """The begun questions (their pieces read, no logits yet) whose last forwards the next
    step runs, in one forward: the first position's, in `todo`'s order, where the adapter
    runs them all as one batch (adapter.batches: one bucket, or a mixed batch of theirs);
    else of the first group of 2 or more at one position padding to one bucket
    (adapter.fork_rows), the most of its first ones the adapter runs as one batch (at most
    its largest batch), else the first question alone; [] for none. So an ask whose
    questions pad to several buckets (a long router question beside short ones) that no
    mixed batch takes still batches the short ones (Reader.advance_many)."""
    by_pos: dict[int, list[Pending]] = {}
    for p in todo:
        by_pos.setdefault(p.fw.pos, []).append(p)
    for group in by_pos.values():     # every bucket at one position (a mixed batch) in one
        if len(group) > 1 and adapter.batches([len(p.fw.rest) for p in group],
                                              [p.fw.pos for p in group],
                                              shared_rows([p.fw for p in group])):
            return group
    groups: dict[tuple[int, int], list[Pending]] = {}
    for p in todo:
        groups.setdefault((p.fw.pos, adapter.fork_rows(len(p.fw.rest))), []).append(p)
    for group in groups.values():
        lengths = [len(p.fw.rest) for p in group]
        size = next((k for k in range(len(group), 1, -1)     # the rows its first k share
                     if adapter.batches(lengths[:k], [group[0].fw.pos] * k,
                                        shared_rows([p.fw for p in group[:k]]))), 0)
        if size:
            return group[:size]
    return todo[:1]


def to_answer(adapter: Adapter, fw: Forward, logits: torch.Tensor,
              choices: list[str]) -> Answer:
    """The Answer of a fork's letters' logits [len(choices)] (the device synchronised)."""
    probs = torch.softmax(logits, dim=-1).tolist()
    adapter.sync()
    best = max(range(len(probs)), key=probs.__getitem__)
    return Answer(label=choices[best], letter=chr(65 + best), probs=tuple(probs),
                  ms=(time.perf_counter() - fw.t0) * 1e3,
                  num_forwarded_tokens=fw.num_committed + fw.num_scratch + fw.num_ids,
                  num_committed=fw.num_committed, backlog=fw.backlog, at=fw.at,
                  beyond_max_positions=fw.end > adapter.max_positions,
                  stale=fw.stale)


def answer(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
           q_ids: list[int], letters: list[int], choices: list[str], at: int,
           scratch: Scratch | None = None) -> Answer:
    """Answer a letter-choice question at `at` (validated by the caller) in one call: start,
    the pieces, finish_answer. See the module doc.

    Returns an Answer whose probs are the softmax (fp32) over the letters' logits."""
    fw = start(adapter, rcfg, store, st, "", q_ids, at,
               question_padding(adapter, at, len(q_ids)), scratch)
    try:
        return finish_answer(adapter, store, fw, letters, choices)
    finally:
        release(store, fw)


@dataclass(frozen=True)
class Generation:
    """ids: the greedy continuation (ending with a stop id when one came); prefill_ms: the fork's
    first forward (tail and prompt, after any chunks it had to read); ms_per_token: mean wall
    time of the one-token decode steps (those the decode loop ran past a stop id it saw late
    included); num_forwarded_tokens: as Answer's; at: the position; stale: as Answer's (the
    session holds a prefix of what the host sent, Reader.stale)."""

    ids: tuple[int, ...]
    prefill_ms: float
    ms_per_token: float
    num_forwarded_tokens: int
    at: int
    stale: bool = False


@dataclass
class Decoding:
    """A fork's greedy decoding in progress after its prompt (`start_decoding`): the ids so far
    (`ids`, ending with a stop id when one came), the next id to feed (`ids[-1]`) at `pos`, the
    states before it, the steps run and the times; `done` once a stop id came or
    `max_new_tokens` ids were made."""

    fw: Forward
    kv: PagedKv
    ids: list[int]
    max_new_tokens: int
    stop_ids: set[int]
    num_steps: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0

    @property
    def done(self) -> bool:
        return len(self.ids) >= self.max_new_tokens or self.ids[-1] in self.stop_ids


def start_decoding(adapter: Adapter, store: PageStore, fw: Forward, max_new_tokens: int,
                   stop_ids: set[int]) -> Decoding:
    """The fork's last prompt forward (its pieces read) and its first id (adapter.prefill);
    the fork's pages for every token taken now."""
    while forward_piece(adapter, store, fw):
        pass
    t0 = time.perf_counter()
    token, fw.gdn = adapter.prefill(fw.rest, fw.pos, kv(store, fw, fw.rows), fw.gdn)
    fw.pos += len(fw.rest)
    fw.rest = []
    adapter.sync()
    return Decoding(fw, kv(store, fw, fw.rows), [token], max_new_tokens, set(stop_ids),
                    prefill_ms=(t0 - fw.t0) * 1e3 + (time.perf_counter() - t0) * 1e3)


def decode_burst(adapter: Adapter, dec: Decoding, max_steps: int) -> None:
    """Up to max_steps (>= 1) more ids (adapter.decode_burst), none once `dec.done`. Bursts
    give the ids one decode gives, bit for bit."""
    if dec.done:
        return
    t0 = time.perf_counter()
    fw = dec.fw
    n = min(max_steps, dec.max_new_tokens - len(dec.ids))
    new, steps, fw.gdn = adapter.decode_burst(dec.ids[-1], fw.pos, dec.kv, fw.gdn, n,
                                              dec.stop_ids)
    adapter.sync()
    fw.pos += steps
    dec.ids += new
    dec.num_steps += steps
    dec.decode_ms += (time.perf_counter() - t0) * 1e3


def generation(dec: Decoding) -> Generation:
    """The Generation of a finished decoding."""
    fw = dec.fw
    return Generation(tuple(dec.ids), dec.prefill_ms,
                      dec.decode_ms / dec.num_steps if dec.num_steps else 0.0,
                      fw.num_committed + fw.num_scratch + fw.num_ids + dec.num_steps, fw.at,
                      fw.stale)


@dataclass
class Pending:
    """A question (letters and choices set) or a decoding (max_new_tokens set; `decoding` once
    its prompt was forwarded) a reader runs in steps (Reader.begin_ask / begin_generate,
    advance, finish_ask / finish_generate, cancel); num_extra_ids: the question's or the
    prompt's own ids."""

    fw: Forward
    num_extra_ids: int
    letters: list[int] | None = None
    choices: list[str] | None = None
    max_new_tokens: int = 0
    stop_ids: frozenset = frozenset()
    decoding: Decoding | None = None
    logits: torch.Tensor | None = None     # a question's letters' logits, once forwarded


def generate(adapter: Adapter, rcfg: ReaderConfig, store: PageStore, st: SessionState,
             prompt_ids: list[int], at: int, max_new_tokens: int, stop_ids: set[int],
             scratch: Scratch | None = None) -> Generation:
    """Greedy decoding on top of ids[:at] + prompt_ids in a fork, in one call (start,
    start_decoding, the bursts): KV rows above C go to scratch pages, the GDN states it
    produces are dropped. Depends only on ids[:at] and the prompt."""
    fw = start(adapter, rcfg, store, st, "", prompt_ids, at, max_new_tokens, scratch)
    try:
        dec = start_decoding(adapter, store, fw, max_new_tokens, stop_ids)
        decode_burst(adapter, dec, max_new_tokens)
        return generation(dec)
    finally:
        release(store, fw)
