"""Moving pages and GDN entries between memory (the page store's pool and GDN table) and the
disk tier (disk.DiskStore): a session's spill (its pages, its states at C and its checkpoints'
entries, each written once by key, then its manifest) and the loading of what a resume found
on disk (pages.find_resume).

Spill: the pages not yet on disk leave the pool a group at a time (kv_pool.pages_to_cpu, into
page-locked memory on CUDA) and are written in threads (safetensors releases the GIL); a page
already on disk only has its time renewed. Load: page files are read and checked in threads
straight into one host buffer a group (page_read.read_page_into; `fast=False`: safetensors'
read then a copy, DiskStore.read_page, the slow twin), their ids compared with the prompt's,
and the buffer written into the pool in one copy (kv_pool.put_pages).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from block_store.disk.files import RefusedFile
from block_store.disk.page_read import read_page_into, whole
from block_store.disk.store import DiskStore, Manifest
from block_store.memory.kv_pool import pages_to_cpu, put_page, put_pages
from block_store.pages import PageStore, Resume
from block_store.session import Checkpoint, SessionState

IO_THREADS = min(8, os.cpu_count() or 1)
GROUP_PAGES = 32      # pages a spill takes off the device at a time (about 200 MB on the 0.8B)
FAST_READ = True      # a load reads page files straight into its buffer (page_read)


def manifest_of(st: SessionState, stale: bool | None = None) -> Manifest:
    """What a restart trusts for `st`: ids, C, page keys, the key of its states at C,
    checkpoints, pending lines, the shared line, and whether it is stale (default: st.stale)."""
    return Manifest(ids=list(st.ids), committed=st.committed,
                    page_keys=[k.hex() for k in st.keys],
                    state_key=st.keys[-1].hex() if st.committed else None,
                    checkpoints=[(cp.pos, cp.entry.key.hex(), cp.episode_start, cp.kept)
                                 for cp in st.checkpoints],
                    pending_lines=dict(st.pending_lines), shared_line=st.shared_line,
                    stale=st.stale if stale is None else stale)


def save_session(store: PageStore, disk: DiskStore, sid: str, st: SessionState,
                 pinned: bool | None = None, durable: bool = False,
                 stale: bool | None = None) -> Path:
    """Write what `st` needs that the disk lacks (its pages, its states at C, its checkpoints'
    and tip ring's entries: a restart finds them by key), then its manifest (fsynced). Pages
    leave the device GROUP_PAGES at a time (`pinned`: through page-locked host memory; default
    on CUDA) while the files of the group before are written; page and entry files are fsynced
    only when `durable` (DiskStore.write_page). Returns the manifest's path. Raises OSError
    (disk full, folder gone; files.atomic_save turns safetensors' errors into it); a manifest
    is written only after everything it names."""
    g = store.grid
    todo = [i for i, k in enumerate(st.keys) if not disk.keep_page(k)]
    with ThreadPoolExecutor(IO_THREADS) as pool:
        jobs = []
        for at in range(0, len(todo), GROUP_PAGES):
            group = todo[at:at + GROUP_PAGES]
            rows = pages_to_cpu(store.pool, [st.pages[i].index for i in group],
                                _pinned(store, pinned))
            jobs += [pool.submit(disk.write_page, st.keys[i], st.ids[i * g:(i + 1) * g],
                                 rows[j], durable) for j, i in enumerate(group)]
        entries = {e.key: (e.line, e.states, e.kind)   # the tip ring too: a restart finds
                   for e in st.tip}                      # the lines just below C (issue 33)
        entries.update({cp.entry.key: (cp.pos, cp.gdn, cp.entry.kind) for cp in st.checkpoints})
        if st.committed:                   # the states at C (a checkpoint's when one is there)
            entries.setdefault(st.keys[-1], (st.committed, st.gdn, "state"))
        jobs += [pool.submit(disk.write_entry, key, *e, durable) for key, e in entries.items()]
        for j in jobs:
            j.result()                     # raises the first OSError
    m = manifest_of(st, stale)
    path = disk.write_manifest(sid, m, st.manifest_mark)
    st.manifest_mark = m.mark
    return path


def line_on_disk(store: PageStore, ids, most: int, seen: dict[Path, bool] | None = None) -> int:
    """The deepest grid line at or below `most` where a restore of `ids` could resume from
    the disk alone (as pages.find_resume looks: its pages from 0 in order, and a GDN entry at
    the end of one of them), by the files being there and whole (page_read.whole: sizes
    from their headers, no data read, no checksum: damaged bytes are found by the restore);
    0 without a disk. `seen`: path -> whole, shared between sessions (a common prefix's pages
    are looked at once)."""
    disk, g = store.disk, store.grid
    if disk is None:
        return 0
    seen = {} if seen is None else seen

    def ok(path: Path) -> bool:
        if path not in seen:
            seen[path] = whole(path)
        return seen[path]

    keys: list[bytes] = []
    for i in range(min(most, len(ids)) // g):
        key = store.key_after(keys, [int(x) for x in ids[i * g:(i + 1) * g]])
        if not ok(disk.page_path(key)):
            break
        keys.append(key)
    for n in range(len(keys), 0, -1):           # the deepest state first
        if ok(disk.entry_path(keys[n - 1])):
            return n * g
    return 0


def prefetch_pages(store: PageStore, ids, pinned: bool | None = None,
                   max_pages: int | None = None, before_read=None) -> int:
    """Read ahead, into store.prefetched, the page files a restore or resume of `ids` would
    read: of its whole grid chunks from the first, in order, up to the first whose file is not
    on disk, those the pool does not hold (memory.pool's lookup), and only below the deepest
    grid line where a GDN state is held (in the GDN table or on disk): a resume stops there
    (pages.find_resume). At most `max_pages`, and what store.prefetched has room for (default:
    both). Files are read and checked in threads as load_resume reads them
    (page_read.read_page_into), each page into a buffer of its own (`pinned`: page-locked,
    default on CUDA), up to the first refused (the restore finds it again and sets it aside);
    rows already held are skipped. `before_read()` is called once before the first file is
    read (not when there is none to read). Called without the reader's lock: it reads the
    pool's and the GDN table's indexes and the disk only, and changes nothing but
    store.prefetched. Returns the pages read. 0 without a disk."""
    disk, pre, g = store.disk, store.prefetched, store.grid
    if disk is None or pre is None:
        return 0
    room = pre.free_bytes() // store.pool.page_bytes
    most = room if max_pages is None else min(room, max_pages)
    keys, todo, stop = [], [], 0             # todo: (page, key, chunk ids); stop: a state line
    for i in range(len(ids) // g):
        chunk = [int(x) for x in ids[i * g:(i + 1) * g]]
        keys.append(store.key_after(keys, chunk))
        key = keys[-1]
        held = store.manager.lookup(key, chunk) is not None
        if not held and not disk.has_page(key):
            break
        entry = store.gdn.entries.get(key)
        if (entry is not None and entry.line == (i + 1) * g) or disk.entry_path(key).is_file():
            stop = i + 1
        if not held and key not in pre:
            todo.append((i, key, chunk))
    todo = [t for t in todo if t[0] < stop][:max(0, most)]
    if todo and before_read is not None:
        before_read()
    return _read_ahead(store, todo, _pinned(store, pinned))


def _read_ahead(store: PageStore, todo: list, pinned: bool) -> int:
    """prefetch_pages' reads: pages `todo` ((page, key, chunk ids), in order) into
    store.prefetched, up to the first refused. Returns the pages read."""
    block = store.pool.block

    def read(item) -> torch.Tensor | None:
        rows = torch.empty(*block.shape[:2], *block.shape[3:], dtype=block.dtype,
                           pin_memory=pinned)
        try:
            read_page_into(store.disk, item[1], item[2], rows)
            return rows
        except RefusedFile:
            return None
    num_read = 0
    with ThreadPoolExecutor(IO_THREADS) as threads:
        for item, rows in zip(todo, threads.map(read, todo)):
            if rows is None:
                break
            store.prefetched.put(item[1], item[2], rows)
            num_read += 1
    return num_read


def _pinned(store: PageStore, pinned: bool | None) -> bool:
    return store.spec.device.type == "cuda" if pinned is None else pinned


def load_resume(store: PageStore, res: Resume, prompt: list[int],
                pinned: bool | None = None, fast: bool | None = None) -> Resume | None:
    """`res` with its pages on disk loaded into the pool (named by their keys, unreferenced,
    cached) and its state on disk loaded into the GDN table (unreferenced); the same `res`
    when nothing is on disk. Pages go GROUP_PAGES at a time: their files read and checked in
    threads, each copied into one host buffer (`pinned`: page-locked, default on CUDA; the
    buffers of a group size are reused by torch's host allocator, so only the first restore
    of a process pays for locking them), which goes to the device in one copy. `fast` (default
    FAST_READ): each file read straight into the buffer (page_read.read_page_into), else read
    by safetensors and copied (DiskStore.read_page); the same checks and bits. None when a
    file was refused: it is set aside (counted in disk.refusals) and nothing is changed, so
    the caller looks again."""
    if res.num_disk_pages == 0 and not isinstance(res.state, bytes):
        return res
    disk, g = store.disk, store.grid
    todo = [i for i, p in enumerate(res.pages) if p is None]
    held = store.take_pages([p for p in res.pages if p is not None])   # not reused below
    fresh = [store.allocate() for _ in todo]
    try:
        entry = load_entry(store, res.state, res.line) if isinstance(res.state, bytes) \
            else None
        with ThreadPoolExecutor(IO_THREADS) as threads:
            for at in range(0, len(todo), GROUP_PAGES):
                _load_group(store, res, prompt, todo[at:at + GROUP_PAGES],
                            fresh[at:at + GROUP_PAGES], _pinned(store, pinned),
                            FAST_READ if fast is None else fast, threads)
    except BaseException as e:           # nothing taken stays taken, whatever went wrong
        store.release_pages(fresh)       # blank: reused first
        store.release_pages(held)
        if not isinstance(e, RefusedFile):
            raise
        disk.set_aside(e.path, e.reason)
        return None
    for i, page in zip(todo, fresh):
        res.pages[i] = store.manager.adopt(page, res.keys[i], prompt[i * g:(i + 1) * g])
    store.release_pages(res.pages)       # one reference each, ours: cached, chain head last
    res.num_loaded = len(todo)
    if entry is not None:
        res.state = store.gdn.put(res.state, res.line, *entry)
        store.gdn.release(res.state)
    return res


def load_entry(store: PageStore, key: bytes, line: int):
    """(states per GDN layer (conv [conv_dim, W], recurrent [HV, K, V] fp32) on the spec's
    device, kind) of the GDN entry `key` on disk, which must be at grid line `line`. Raises
    RefusedFile (DiskStore.read_entry's reasons, and 'line' for an entry at another line)."""
    if store.spill is not None:          # an eviction's write of it still queued
        store.spill.wait_entry(key)
    found, states, kind = store.disk.read_entry(key)
    if found != line:
        raise RefusedFile("line", f"the entry is at {found}, its key at {line}",
                          store.disk.entry_path(key))
    dev = store.spec.device
    return [(c.to(dev), r.to(dev)) for c, r in states], kind


def load_checkpoints(store: PageStore, st: SessionState, m: Manifest) -> None:
    """Reference in `st` the manifest's checkpoints at or below its C whose entries are found
    (memory, then disk); a refused entry file is set aside (one at another line is skipped
    and kept)."""
    gdn = store.gdn
    for pos, key_hex, episode, kept in m.checkpoints:
        key = bytes.fromhex(key_hex)
        if pos > st.committed or st.keys[pos // store.grid - 1] != key:
            continue
        held = gdn.get(key)
        if held is not None:
            entry = gdn.put(key, pos, held.states)
        else:
            try:
                entry = gdn.put(key, pos, *load_entry(store, key, pos))
            except RefusedFile as e:
                if e.reason != "line":
                    store.disk.set_aside(e.path, e.reason)
                continue
        st.checkpoints.append(Checkpoint(pos, entry, episode, kept))


def _load_group(store: PageStore, res: Resume, prompt: list[int], group: list[int],
                pages: list, pinned: bool, fast: bool, threads: ThreadPoolExecutor) -> None:
    """Pages `group` of `res` (indices into res.pages) into pool pages `pages`: the rows read
    ahead (store.prefetched, prefetch_pages) where they are held, else from disk, the files
    read by `threads`."""
    g, block = store.grid, store.pool.block
    if store.prefetched is not None:
        ahead = [store.prefetched.take(res.keys[i], prompt[i * g:(i + 1) * g]) for i in group]
        for rows, page in zip(ahead, pages):
            if rows is not None:             # read and checked by prefetch_pages
                put_page(store.pool, page.index, rows)
        left = [j for j, rows in enumerate(ahead) if rows is None]
        if len(left) < len(group):
            group, pages = [group[j] for j in left], [pages[j] for j in left]
        if not group:
            return
    rows = torch.empty(len(group), *block.shape[:2], *block.shape[3:], dtype=block.dtype,
                       pin_memory=pinned)

    def read(j: int) -> None:
        i = group[j]
        if fast:
            read_page_into(store.disk, res.keys[i], prompt[i * g:(i + 1) * g], rows[j])
        else:
            rows[j].copy_(store.disk.read_page(res.keys[i], prompt[i * g:(i + 1) * g]))
    list(threads.map(read, range(len(group))))
    put_pages(store.pool, [p.index for p in pages], rows)
