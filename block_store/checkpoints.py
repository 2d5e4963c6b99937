"""Checkpoint keeping, resuming after a rewrite, committing a chunk.

Where a checkpoint belongs (the chat-aware lines: a turn's generation prompt, an episode's
start, the end of the shared system message) is the reader's business (shadow_plugin.reader.lines);
it hands the lines down as positions (SessionState.pending_lines, .shared_line). A checkpoint
is a reference to the GDN table's entry at its line (pages.PageStore.gdn). Keeping: the
checkpoints at the start of the current episode and at the shared line always stay; past
`max_checkpoints` the oldest other one goes (its entry stays in the table, unreferenced,
until evicted). A prompt resumes through pages.find_resume: its own older lines and other
sessions' pages are found the same way.
"""
from __future__ import annotations

from block_store.disk_io import load_resume
from block_store.memory.gdn_table import GdnEntry
from block_store.memory.layout import GdnState, clone_gdn
from block_store.memory.pool import Page
from block_store.pages import PageStore, Resume, find_resume, resume_states, served
from block_store.session import Checkpoint, SessionState

# The tip ring: the GDN entries at the last TIP_LINES lines a session's C stood at (every chunk
# committed, within one read too, and the line a prompt resumed at), so a rewrite whose first
# difference lies within TIP_LINES - 1 pages below C resumes within a page of it (issue 33).
# The 2,200-id read with a change at 1,500 needs the third line below C: 4 keeps one spare.
TIP_LINES = 4
MAX_LOOKUPS = 8   # lookups with the disk before one without (files refused one after another)


COMPARE_BLOCK = 4096   # ids a slice comparison of first_difference takes at a time


def first_difference(held: list[int], new: list[int]) -> int:
    """First position where the two differ; min(len) when one is a prefix of the other.
    Compares slices of COMPARE_BLOCK ids (C's list comparison) and walks only the block that
    differs, where `first_difference_ref`, its twin, walks every id (a turn's prompt is
    compared under the events thread's hold inside vLLM, which a host step may wait for)."""
    n = min(len(held), len(new))
    for lo in range(0, n, COMPARE_BLOCK):
        hi = min(lo + COMPARE_BLOCK, n)
        if held[lo:hi] != new[lo:hi]:     # or only their types differ (a list, a tuple)
            d = first_difference_ref(held[lo:hi], new[lo:hi])
            if d < hi - lo:
                return lo + d
    return n


def first_difference_ref(held: list[int], new: list[int]) -> int:
    """first_difference one id at a time (its twin in tests)."""
    n = min(len(held), len(new))
    for i in range(n):
        if held[i] != new[i]:
            return i
    return n


def rollback_target(checkpoints: list[Checkpoint], d: int) -> Checkpoint | None:
    """The newest checkpoint at or below position d, or None (0)."""
    best = None
    for cp in checkpoints:
        if cp.pos <= d and (best is None or cp.pos > best.pos):
            best = cp
    return best


def add(checkpoints: list[Checkpoint], cp: Checkpoint,
        max_checkpoints: int) -> tuple[list[Checkpoint], list[Checkpoint]]:
    """Insert `cp` (replacing one at the same line), clear the episode mark of the others when
    `cp` starts an episode, and drop the oldest checkpoints that are neither the episode's nor
    kept past the cap. Returns (kept, dropped)."""
    same = [c for c in checkpoints if c.pos == cp.pos]
    cp.episode_start = cp.episode_start or any(c.episode_start for c in same)
    cp.kept = cp.kept or any(c.kept for c in same)
    kept = [c for c in checkpoints if c.pos != cp.pos]
    if cp.episode_start:
        for c in kept:
            c.episode_start = False
    kept = sorted(kept + [cp], key=lambda c: c.pos)
    dropped = list(same)
    while len(kept) > max_checkpoints:
        oldest = next((c for c in kept if not (c.episode_start or c.kept)), None)
        if oldest is None:
            break
        kept.remove(oldest)
        dropped.append(oldest)
    return kept, dropped


def take(store: PageStore, st: SessionState, episode_start: bool, max_checkpoints: int,
         kept: bool = False) -> None:
    """Keep the GDN states at C as a checkpoint: the table's entry at C (stored now unless
    held already); none at 0 (the zero state needs none)."""
    if st.committed == 0:
        return
    entry = store.gdn.put(st.keys[-1], st.committed, st.gdn, "shared" if kept else "checkpoint")
    cps, dropped = add(st.checkpoints, Checkpoint(st.committed, entry, episode_start, kept),
                       max_checkpoints)
    st.checkpoints = cps
    for c in dropped:                       # past the cap (or replaced at its line)
        store.gdn.give_up(c.entry)


def resume(store: PageStore, st: SessionState, prompt: list[int], d: int,
           cause: str = "other") -> Resume:
    """Move the session to where `prompt` (whose first difference from the held ids is d)
    resumes (pages.find_resume; what it found on disk loaded by disk_io.load_resume, counted
    under the 'disk' tier): its pages below the line, C = the line, the states there;
    checkpoints above d and tip entries above the line go, the line's own entry joins the tip
    ring; where held pages end without a state above the line, an entry is due at their end
    (the junction: the admission idea of vLLM PR #37898). Counts the prompt's lookup; `cause`
    ('bpe', 'template', 'other') names what the ids read again below the session's furthest C
    will be counted under."""
    for attempt in range(MAX_LOOKUPS + 1):       # again when a file on disk was refused
        res = find_resume(store, st.pages, st.keys, st.committed, prompt, d,
                          use_disk=attempt < MAX_LOOKUPS)
        if load_resume(store, res, prompt) is not None:
            break
    gdn = resume_states(store, res, st.gdn)
    new_pages = store.take_pages(res.pages)
    store.release_pages(st.pages)
    st.pages, st.keys, st.committed, st.gdn = new_pages, res.keys, res.line, gdn
    # above d a checkpoint or tip holds the states of ids no prompt sends again (the host's
    # own tokens of an output, a rendering the template dropped): given up
    for c in [c for c in st.checkpoints if c.pos > d]:
        store.gdn.give_up(c.entry, worth_writing=False)
    st.checkpoints = [c for c in st.checkpoints if c.pos <= d]
    keep = min(d, res.line)
    for e in [e for e in st.tip if e.line > keep]:
        store.gdn.give_up(e, worth_writing=False)
    st.tip = [e for e in st.tip if e.line <= keep]
    if isinstance(res.state, GdnEntry) and st.counted:      # the line C stands at now
        push_tip(store, st, store.gdn.put(res.state.key, res.line, res.state.states))
    st.junction = res.matched if res.matched > res.line else 0
    if res.line < st.furthest:
        st.reread_cause = cause
    c, on_disk = store.counters, res.num_loaded * store.grid
    c.prefix_cache_queried_tokens += len(prompt)
    c.prefix_cache_hit_tokens["memory"] += res.line - on_disk
    c.prefix_cache_hit_tokens["disk"] += on_disk
    return res


def held_chunk(store: PageStore, st: SessionState) -> tuple[bytes, Page | None, GdnEntry | None]:
    """The key of the next chunk [C, C + G) and, when the pool holds its page and the GDN table
    the states at its end (another session read it, or this one before a rewrite), both
    (none referenced yet); else (key, None, None)."""
    g, c = store.grid, st.committed
    ids = st.ids[c:c + g]
    key = store.key_after(st.keys, ids)
    page = store.manager.lookup(key, ids)
    entry = store.gdn.entries.get(key) if page is not None else None
    if entry is None or entry.line != c + g:
        return key, None, None
    return key, page, entry


def commit_held(store: PageStore, st: SessionState, key: bytes, page: Page, entry: GdnEntry,
                max_checkpoints: int) -> None:
    """Advance C over a chunk whose page and end states are held (held_chunk): no forward;
    the ids count as prefix-cache hits, not as read."""
    store.manager.take(page)
    served(store, entry)
    if st.counted:
        store.counters.prefix_cache_hit_tokens["memory"] += store.grid
    _advance(store, st, page, key, clone_gdn(entry.states), max_checkpoints, read=False)


def commit_chunk(store: PageStore, st: SessionState, page: Page, gdn: GdnState,
                 max_checkpoints: int, key: bytes | None = None) -> None:
    """A chunk [C, C + G) was read into `page` (one reference from the caller), `gdn` the
    states after it (`key`: its key when known): name the page (or take the page already
    holding its content), advance C, keep the states, take the checkpoints due at the new C
    and the tip entries."""
    g, c = store.grid, st.committed
    ids = st.ids[c:c + g]
    key = key or store.key_after(st.keys, ids)
    _advance(store, st, store.manager.adopt(page, key, ids), key, gdn, max_checkpoints)


def _advance(store: PageStore, st: SessionState, page: Page, key: bytes, gdn: GdnState,
             max_checkpoints: int, read: bool = True) -> None:
    """C += G with `page` (referenced) and the states after it; counters, checkpoints due,
    the junction's entry and the tip."""
    g = store.grid
    st.pages.append(page)
    st.keys.append(key)
    st.gdn = gdn
    st.committed += g
    counters = store.counters
    if st.counted and read:
        counters.read_tokens += g
        if st.committed <= st.furthest:
            counters.reread_tokens[st.reread_cause] += g
    st.furthest = max(st.furthest, st.committed)
    if st.committed in st.pending_lines:
        take(store, st, st.pending_lines.pop(st.committed), max_checkpoints)
    if st.committed == st.shared_line:
        take(store, st, False, max_checkpoints, kept=True)
    if st.committed == st.junction:          # for the next session with this prefix
        store.gdn.release(store.gdn.put(key, st.committed, gdn, "junction"))
    if st.counted:                          # not a fork's scratch base: its reads are a question's
        push_tip(store, st, store.gdn.put(key, st.committed, gdn, "tip"))


def push_tip(store: PageStore, st: SessionState, entry: GdnEntry) -> None:
    """Put `entry` (one reference, the caller's: the ring keeps it) into the session's tip
    ring as its newest line; past TIP_LINES the oldest is given up (GdnTable.give_up: gone at
    once when nothing else references it). An entry already in
    the ring moves to its newest place and the extra reference is given back."""
    held = next((e for e in st.tip if e is entry), None)
    if held is not None:
        st.tip.remove(held)
        store.gdn.release(entry)
    st.tip.append(entry)
    while len(st.tip) > TIP_LINES:
        store.gdn.give_up(st.tip.pop(0))
