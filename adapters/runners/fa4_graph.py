"""FlashAttention-4's calls of a chunk inside the chunk's one CUDA graph (runners.graphs, attention
"fa4"): the splits' and the causal tail's sub-page tables in fixed shapes, built on the device
from the staged position and page table (`SplitTables.fill`, Triton; twin `tables_ref`), and
the attention over them (`attend`), with the key counts on the device (FA4's `seqused_k`).

Why: with tables sized to each chunk, FA4's calls ran eagerly between the chunk's 7 segment
graphs, so the host launched 12 FA4 calls and 6 combines a chunk, and a backlog read over pages
was 3-5 % slower than over contiguous buffers (BENCHMARKS.md, 2026-12-02). With tables of fixed
width [S, W] and the key counts in device memory nothing a kernel's launch depends on changes
between positions with the same number of splits S (`fa4_plan.split_plan`), so one graph of
the whole body serves every position with S splits. evals/fa4_graph_probe.py at cadb457
showed on the H200 (docs/fa4-graph-probe-2026-12-02.log) that these calls give the runner's
eager calls' bits at 16k-99k, eagerly and replayed from one capture, and take 0.127 / 0.562
ms a layer at 16k / 96k replayed against 0.163 / 0.618 eagerly. FA4 reads
page_table[b, :seqused_k[b] / 64] only, with the causal alignment from seqused_k
(flash-attn-4 4.0.0b36's source read in docs/fa4-graph-capture.md), so entries past a row's
count are never read.

The splits are the same as the eager path's: S rows of Ls = pos // S // 128 * 128 keys over
[0, S Ls), the tail [S Ls, pos + T) causal; so are the kernels' per-tile arithmetic and the
combine. A graph's FA4 calls name the pools' addresses (TMA descriptors): a graph serves one
pool (the runner keys its graphs by the pool).
"""
from __future__ import annotations

import time
import warnings
from collections import OrderedDict

import torch
import triton
import triton.language as tl

from adapters.attention.combine import combine_lse
from adapters.attention.fa4_plan import SUB_PAGE, TILE_MN
from adapters.runners import capture

BLOCK = 1024            # table entries a program writes
# pools besides the pinned one (the reader's) whose graphs are kept; 2 while none is pinned
# (a reader without a warm-up, and its check_exact's fresh pool)
MAX_OTHER_POOLS = 1


@triton.jit
def _tables_kernel(META, POS_AT, TABLE_AT, SPLIT_TAB, SPLIT_LEN, TAIL_TAB, TAIL_LEN, T,
                   W_SPLIT, PER_PAGE: tl.constexpr, S: tl.constexpr, BLOCK: tl.constexpr):
    """Program (c, b): entries [c * BLOCK, (c + 1) * BLOCK) of split b's table (b < S) or the
    tail's (b = S), and, for c = 0, its key count. META int64: pos at POS_AT, the page table
    at TABLE_AT; sub-page x of the sequence is page[x // PER_PAGE] * PER_PAGE + x % PER_PAGE."""
    c, b = tl.program_id(0), tl.program_id(1)
    pos = tl.load(META + POS_AT)
    ls = pos * 0
    if S > 0:
        ls = pos // S // 128 * 128
    per = ls // 64
    start = b * per
    count = tl.where(b < S, per, (pos + T) // 64 - S * per)
    i = c * BLOCK + tl.arange(0, BLOCK)
    x = start + i
    ok = i < count
    page = tl.load(META + TABLE_AT + x // PER_PAGE, mask=ok, other=0)
    sub = (page * PER_PAGE + x % PER_PAGE).to(tl.int32)
    if b < S:
        tl.store(SPLIT_TAB + b * W_SPLIT + i, sub, mask=ok)
        if c == 0:
            tl.store(SPLIT_LEN + b, ls.to(tl.int32))
    else:
        tl.store(TAIL_TAB + i, sub, mask=ok)
        if c == 0:
            tl.store(TAIL_LEN, (pos + T - S * ls).to(tl.int32))


def widths(s: int, t: int, max_rows: int) -> tuple[int, int]:
    """(W_split, W_tail): sub-pages a split's row and the tail's row hold for chunks of t rows
    with s splits ending at or below max_rows (pos + t <= max_rows). A split holds
    Ls <= max_rows / s keys; the tail holds pos + t - s Ls < t + 128 s keys (Ls is pos / s
    rounded down to 128), all of [0, pos + t) when s = 0."""
    if s == 0:
        return 0, -(-max_rows // SUB_PAGE)
    return -(-max_rows // s // SUB_PAGE), t // SUB_PAGE + 2 * s


class SplitTables:
    """The fixed-shape FA4 inputs of a runner's chunks with s splits, on its device (int32):
    split [s, W_split] and split_len [s] (None for s = 0), tail [1, W_tail] and tail_len [1].
    Entries past a row's count keep old values: FA4 does not read them.

    Args: s (splits), t (rows a chunk), max_rows (most sequence rows a chunk ends at),
    device. Raises ValueError when t is not a multiple of SUB_PAGE."""

    def __init__(self, s: int, t: int, max_rows: int, device: torch.device):
        if t % SUB_PAGE:
            raise ValueError(f"chunks of {t} rows: FA4 reads sub-pages of {SUB_PAGE}")
        self.s, self.t = s, t
        w_split, w_tail = widths(s, t, max_rows)
        z = lambda *n: torch.zeros(*n, dtype=torch.int32, device=device)  # noqa: E731
        self.split = z(s, w_split) if s else None
        self.split_len = z(s) if s else None
        self.tail, self.tail_len = z(1, w_tail), z(1)

    def fill(self, meta: torch.Tensor, pos_at: int, table_at: int, page_rows: int) -> None:
        """The tables and key counts of the chunk staged in meta (int64: pos at pos_at, the
        page table at table_at, pages of page_rows rows), one kernel (capturable: no host
        read). The staged pos must have self.s splits (the runner picks the tables by it)."""
        dummy = self.tail
        w_split = self.split.shape[1] if self.s else 0
        grid = (triton.cdiv(max(w_split, self.tail.shape[1]), BLOCK), self.s + 1)
        _tables_kernel[grid](meta, pos_at, table_at, self.split if self.s else dummy,
                             self.split_len if self.s else dummy, self.tail, self.tail_len,
                             self.t, w_split, PER_PAGE=page_rows // SUB_PAGE, S=self.s,
                             BLOCK=BLOCK)


class BatchTables:
    """B forks' SplitTables of s splits (`forks`, each filled from its own staged table) and
    their tails as one FA4 call takes them (`attend_many`; `gather` copies them there): tail
    [B, W_tail] and tail_len [B], int32 on `device` (FA4 takes its key counts contiguous, so
    a fork's own tables are not views of these). The splits need no copy: attend_many reads
    every fork's rows through fork 0's split tables. Args as SplitTables, and num_seqs (B)."""

    def __init__(self, s: int, t: int, max_rows: int, device: torch.device, num_seqs: int):
        self.s, self.t, self.num_seqs = s, t, num_seqs
        self.forks = [SplitTables(s, t, max_rows, device) for _ in range(num_seqs)]
        w_tail = widths(s, t, max_rows)[1]
        z = lambda *n: torch.zeros(*n, dtype=torch.int32, device=device)  # noqa: E731
        self.tail, self.tail_len = z(num_seqs, w_tail), z(num_seqs)

    def gather(self) -> None:
        """The forks' filled tails into the batch's (two copies on the device; capturable)."""
        torch.cat([f.tail for f in self.forks], out=self.tail)
        torch.cat([f.tail_len for f in self.forks], out=self.tail_len)


def tables_ref(s: int, pos: int, t: int, pages, page_rows: int) -> dict:
    """Twin of SplitTables.fill in torch: {"split": [s, Ls / 64] or None, "split_len": [s] or
    None, "tail": [1, (pos + t - s Ls) / 64], "tail_len": [1]}, int64: the entries a fill
    writes (its tables' leading columns)."""
    per_page = page_rows // SUB_PAGE
    sub = (torch.as_tensor(pages, dtype=torch.int64)[:, None] * per_page
           + torch.arange(per_page)).flatten()
    ls = pos // s // 128 * 128 if s else 0
    cut, n = s * ls // SUB_PAGE, (pos + t) // SUB_PAGE
    return {"split": sub[:cut].view(s, -1) if s else None,
            "split_len": torch.full((s,), ls) if s else None,
            "tail": sub[cut:n].view(1, -1), "tail_len": torch.tensor([pos + t - s * ls])}


def attend(fwd, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
           tables: SplitTables, out: torch.Tensor, side=None) -> None:
    """Causal attention (bottom-right aligned, scale D^-0.5) of q [T, H, D] over the rows the
    filled `tables` name in the pools k_pool, v_pool [num_pages, G, Hkv, D] (read as 64-row
    sub-pages) into out [T, H * D] (contiguous), all in the pools' dtype: the splits
    (non-causal, a batch of S copies of q as one view with a stride-0 batch: flash-attn-4
    4.0.0b36 reads it without a copy, compiling its kernel for that broadcast pattern; on
    an H100 a question batch whose splits copied q gave each fork its runner's bits with the
    view, docs/bi-bench-questions-h100-2026-12-06-h.log), the tail (causal), their
    log-sum-exp combine (attention.combine.combine_lse); with S = 0 the tail alone, straight
    into out. fwd: flash_attn.cute.interface._flash_attn_fwd. side: a CUDA stream for the
    splits while the tail runs on the current one (forked and joined by events: inside a
    capture, two graph branches), or None for one stream. No host read or sync: capturable.
    Nothing is checked here (the runner's inputs are fixed at its construction)."""
    t, h, d = q.shape
    hkv = k_pool.shape[2]
    k, v = k_pool.view(-1, SUB_PAGE, hkv, d), v_pool.view(-1, SUB_PAGE, hkv, d)
    q = q.contiguous()
    s = tables.s
    call = dict(tile_mn=TILE_MN)
    if s == 0:
        fwd(q[None], k, v, page_table=tables.tail, seqused_k=tables.tail_len, causal=True,
            out=out.view(1, t, h, d), **call)
        return
    o_part = torch.empty(s + 1, t, h, d, device=q.device, dtype=q.dtype)
    lse_part = torch.empty(s + 1, h, t, device=q.device, dtype=torch.float32)
    qs = q[None].expand(s, t, h, d)        # S copies as a stride-0 view (FA4 reads it so)

    def splits():
        fwd(qs, k, v, page_table=tables.split, seqused_k=tables.split_len, causal=False,
            out=o_part[:s], lse=lse_part[:s], **call)

    tail = lambda: fwd(q[None], k, v, page_table=tables.tail,  # noqa: E731
                       seqused_k=tables.tail_len, causal=True, out=o_part[s:],
                       lse=lse_part[s:], **call)
    _splits_beside_tail(splits, tail, side, q.device)
    combine_lse(o_part, lse_part, out)


def _splits_beside_tail(splits, tail, side, device: torch.device) -> None:
    """splits() on the CUDA stream `side` while tail() runs on the current one (forked and
    joined by events: inside a capture, two graph branches), or both on the current one
    when side is None."""
    if side is None:
        splits()
        tail()
        return
    # the caller's stream waits for the splits also when a call raises: the scratch is
    # freed after that wait, and a capture's fork is always joined
    caller = torch.cuda.current_stream(device)
    side.wait_stream(caller)
    try:
        with torch.cuda.stream(side):
            splits()
        tail()
    finally:
        caller.wait_stream(side)


def attend_many(fwd, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                tables: BatchTables, out: torch.Tensor, side=None) -> None:
    """`attend` for B forks of t rows each in three calls: q [B * t, H, D] (fork b's rows
    b t .. (b + 1) t) over the rows fork b's filled tables name (tables.forks[b]; its split
    rows read through fork 0's tables, which name the same rows' values) into
    out [B * t, H * D]: one FA4 call of S splits over all B * t rows through fork 0's split
    tables (a batch of S, q broadcast as a stride-0 view: each split's keys read once for
    all forks), one of the forks' causal tails (a batch of B) and one combine of all rows;
    with S = 0 the tails alone, straight into out.

    The forks must hold the same keys and values in rows [0, S Ls) (forks of one session's
    state: the caller checks, BatchRunner.shares). The splits are non-causal, so each row
    of an FA4 tile is computed as in the fork's own call over the same keys; whether FA4
    keeps every fork's bits is measured, not assumed (runners.batch's check). On
    an H100, four 64-row forks at 100k: the split calls took 1.63 ms this way against 1.78
    ms as a batch of S * B over copies of q, every fork's bits kept (evals/question_bench.py
    `q_copies`, docs/bi-bench-questions-h100-2026-12-06-h.log). Capturable, as `attend`."""
    n, s = tables.num_seqs, tables.s
    t, h, d = q.shape[0] // n, q.shape[1], q.shape[2]
    hkv = k_pool.shape[2]
    k, v = k_pool.view(-1, SUB_PAGE, hkv, d), v_pool.view(-1, SUB_PAGE, hkv, d)
    q = q.contiguous()
    call = dict(tile_mn=TILE_MN)
    if s == 0:
        fwd(q.view(n, t, h, d), k, v, page_table=tables.tail, seqused_k=tables.tail_len,
            causal=True, out=out.view(n, t, h, d), **call)
        return
    first = tables.forks[0]
    # part i < S: split i over all B * t rows; part S: the tails, fork b's rows at b t
    o_part = torch.empty(s + 1, n * t, h, d, device=q.device, dtype=q.dtype)
    lse_part = torch.empty(s + 1, h, n * t, device=q.device, dtype=torch.float32)
    lse_tail = torch.empty(n, h, t, device=q.device, dtype=torch.float32)

    def splits():
        fwd(q[None].expand(s, n * t, h, d), k, v, page_table=first.split,
            seqused_k=first.split_len, causal=False, out=o_part[:s], lse=lse_part[:s], **call)

    def tail():
        fwd(q.view(n, t, h, d), k, v, page_table=tables.tail, seqused_k=tables.tail_len,
            causal=True, out=o_part[s].view(n, t, h, d), lse=lse_tail, **call)
        lse_part[s].view(h, n, t).copy_(lse_tail.transpose(0, 1))   # [B, H, t] -> [H, B t]

    _splits_beside_tail(splits, tail, side, q.device)
    combine_lse(o_part, lse_part, out)


class SplitGraphs:
    """A runner's captures of its whole chunk body with FA4 inside: one CUDA graph per number
    of splits S and KV pool (FA4's calls name the pools' addresses), in one memory pool, made
    over the reader's pool at its warm-up (Reader.warm_up, runners.capture.capture_splits), or
    else at the first chunk with that S over a pool; and the SplitTables of each S.

    Each graph's output GDN states are tensors of its own capture; `replay` points the
    runner's StateSlots at them before it copies them out. A runner whose slots return no
    states (a question runner: StateSlots' returned) keeps none: their blocks go back to the
    pool after each capture, so its graphs share them. Graphs of one memory pool are
    replayed one at a time, each run's outputs copied out before the next replay (the
    runner's `run`), so a later capture reusing a freed block of an earlier one loses
    nothing. The pinned pool's graphs (the reader's, `pin`) are kept, and those of the
    MAX_OTHER_POOLS other pools used last (a fresh prefill's pool, as Reader.check_exact
    makes one each time, evicts only the last one's); with none pinned, one more. A capture
    that fails is not tried again for that S and pool: a warning says why and those chunks
    run the body eagerly (the same calls: the same bits). A capture syncs the device and
    empties torch's caches (torch.cuda.graph): inside a serving process, captures belong in
    the warm-up. Args: t (rows a chunk), max_rows (most rows a chunk ends at), device."""

    def __init__(self, t: int, max_rows: int, device: torch.device):
        self.t, self.max_rows, self.device = t, max_rows, device
        self.tables: dict[int, SplitTables] = {}
        # (S, id(pool.pointers)) -> (pool.pointers, graph, output states), least recent first;
        # an entry holds the pointers list, so its id names no other pool while it lives
        self.graphs: OrderedDict = OrderedDict()
        self.num_captures, self.num_failed_captures, self.capture_s = 0, 0, 0.0
        self._mempool = None
        self._pinned = None             # the pinned pool (its pointers as it grows)

    def pin(self, pool) -> None:
        """Keep the graphs over `pool` (a block_store KvPool, the reader's; after it grows,
        those over its new memory) whatever other pools come; one pool is pinned at a
        time."""
        self._pinned = pool

    def drop(self) -> None:
        """Forget every graph (the body they replay changed); the pin and the counts stay."""
        self.graphs.clear()

    def tables_for(self, s: int) -> SplitTables:
        """The SplitTables of S splits (made at the first ask)."""
        if s not in self.tables:
            self.tables[s] = SplitTables(s, self.t, self.max_rows, self.device)
        return self.tables[s]

    def replay(self, s: int, pool, body, slots) -> None:
        """Replay the graph of S splits over `pool` (a block_store KvPool), capturing it first
        (`ensure`). slots: the runner's StateSlots (its outputs are set to this graph's, when
        the graph kept them)."""
        entry = self.ensure(s, pool, body, slots)
        if entry[1] is None:                      # its capture failed: eagerly
            body()
            return
        if entry[2] is not None:
            slots.outputs[:] = entry[2]
        entry[1].replay()

    def ensure(self, s: int, pool, body, slots) -> tuple:
        """The graph of S splits over `pool`: (pool.pointers, graph, output states), captured
        when there is none or it was captured over another pool (or before this one grew).
        The capture runs nothing: the runner's warm-up (runners.capture) ran the body at every
        S eagerly before (FA4 compiles each kind of call at its first). Graphs of the pools
        other than the pinned one beyond the MAX_OTHER_POOLS used last are dropped. A failed
        capture gives (pool.pointers, None, None), kept like a graph."""
        key = (s, id(pool.pointers))
        entry = self.graphs.get(key)
        if entry is None:
            try:
                entry = self._capture(pool, body, slots)
            except Exception as e:               # noqa: BLE001 (eager stays correct)
                self.num_failed_captures += 1
                cause = e.__cause__ or e.__context__      # a capture's end hides the first
                why = f"{type(e).__name__}: {e}" + (
                    f" (after {type(cause).__name__}: {cause})" if cause else "")
                warnings.warn(f"the chunk graph of {s} FA4 splits could not be captured "
                              f"({why[:600]}); its chunks over this pool run eagerly in this "
                              f"process", RuntimeWarning, stacklevel=2)
                entry = (pool.pointers, None, None)
            self.graphs[key] = entry
            pinned = id(self._pinned.pointers) if self._pinned is not None else None
            others = [p for p in dict.fromkeys(k[1] for k in reversed(self.graphs))
                      if p != pinned]                                       # newest first
            keep = MAX_OTHER_POOLS if pinned is not None else MAX_OTHER_POOLS + 1
            for old in [k for k in self.graphs if k[1] in others[keep:]]:
                del self.graphs[old]
        self.graphs.move_to_end(key)
        return entry

    def _capture(self, pool, body, slots) -> tuple:
        t0 = time.perf_counter()
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        graph = capture.graph_of(body, self._mempool)
        self.num_captures += 1
        self.capture_s += time.perf_counter() - t0
        outputs = list(slots.outputs) if slots.returned else None
        slots.release()              # its blocks free for the next capture into the pool
        return pool.pointers, graph, outputs

    def captures(self) -> dict:
        """num_graphs (held now), num_captures, num_failed_captures and capture_s (seconds
        since the start), as the runners report them (ChunkGraphs.captures,
        batch.BatchRunner.captures)."""
        return {"num_graphs": len(self.all()), "num_captures": self.num_captures,
                "num_failed_captures": self.num_failed_captures, "capture_s": self.capture_s}

    def all(self) -> list:
        """The captured graphs (any S, any pool)."""
        return [entry[1] for entry in self.graphs.values() if entry[1] is not None]
