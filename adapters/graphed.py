"""The CUDA-graph path: every forward through a reader's runners (adapters.runners.runners:
the grid chunk runner, question runners padded to row buckets (Runners.rows_of), the
single-token runner and its device-fed decode loop). On CUDA each runner replays CUDA graphs
with FlashAttention-4 (or the table attention) inside or between them; on the CPU the same bodies
run without graphs.
Forks and fresh prefills go through the same chunk runner as reads, so its bits are the
reference on CUDA. Grid chunks of several sessions (`read_chunks`, the scheduler's batches
with batch_sessions > 1) run in one forward per group at positions of one FA4 split count
(runners.batch over the chunk runner, Runners.chunk_batch), checked against each chunk read
alone as below (on CUDA in the warm-up, `check_chunk_batches`): on an H100 four chunks at 16k
took 9.81 ms in one forward against 13.63 ms one at a time with the row-invariant chunk ops
(BENCHMARKS.md, "Inside the CUDA graphs, now"), under the 1.52x ceiling of four chunks' rows
as one sequence (evals/bi_bench.py `chunks --ceiling`), and the timelines almost never have
two sessions' chunks waiting. Several questions' last forwards at one position
(`fork_logits_batch`, the forks of one ask) run in one forward (runners.batch.BatchRunner),
each question with the bits it gets alone: each shape is checked against its forks run alone
(on CUDA in the warm-up, `check_batches`, and only shapes that pass are batched; elsewhere at
its first batch), and a shape whose bits differ runs one fork at a time.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

import torch

from adapters.interface import Adapter, check_rows
from adapters.model import autotune
from adapters.model.qwen35 import Qwen35
from adapters.runners.batch import CHUNK_WAYS, PER_FORK, shape_name
from adapters.runners.runners import Runners
from block_store import PagedKv
from block_store.memory.layout import GdnState


class GraphAdapter(Adapter):
    """Args: model, grid; attention, fused, split, row_invariant: the runners' options
    (Runners); runners: a Runners for this model and grid built elsewhere (tests pass smaller
    buckets). Raises ValueError for an attention this device cannot run, a tiling of another
    attention, or row_invariant for a model whose heads model.rowwise does not take."""

    def __init__(self, model: Qwen35, grid: int, attention: str | None = None,
                 fused: bool | None = None, split=None, runners: Runners | None = None,
                 row_invariant: bool | None = None):
        super().__init__(model, grid)
        self.runners = runners or Runners(model, grid, attention, fused=fused, split=split,
                                          row_invariant=row_invariant)
        if self.runners.chunk.t != grid:
            raise ValueError(f"the runners read chunks of {self.runners.chunk.t} ids, the "
                             f"grid is {grid}")
        # (B, T) -> whether a batch of B forks of T rows gave each the bits of its own
        # runner (`_checked`: in the warm-up on CUDA, else at its first batch)
        self.batch_bits: dict[tuple[int, int], bool] = {}
        self.num_question_batches = 0          # batches run in one forward
        # B -> whether a batch of B grid chunks (Runners.chunk_batch) gave each chunk the bits
        # and states of the chunk runner alone (`_checked_chunks`: on CUDA in
        # check_chunk_batches, else at its first batch)
        self.chunk_bits: dict[int, bool] = {}

    @property
    def path(self) -> str:
        return self.runners.path

    def prepare(self, pool=None, kept_rows: Sequence[int] = (),
                chunk_batches: Sequence[int] = ()) -> None:
        """Runners.prepare; with graphs, also the question batches of every shape
        (Runners.question_batch_shapes, and the mixed ones, Runners.mixed_batch_shapes):
        warmed up, checked against their forks run alone (`check_batches`), then, for the
        shapes that kept the bits, their graphs captured over `pool`; and the chunk batches
        of chunk_batches' sizes (Runners.chunk_batch) the same way (`check_chunk_batches`).
        On CUDA only a shape warmed up and checked here is batched, so no question or read
        waits for a compile, a capture or a check."""
        warm = self.runners.chunk.use_graphs and self.runners.batches_questions
        shapes = self.runners.question_batch_shapes() if warm else []
        self.runners.prepare(pool=pool, kept_rows=kept_rows, question_batches=shapes)
        self.check_batches(shapes)
        for rows, forks in shapes:           # graphs over the reader's pool: passed shapes only
            batch = self.runners.question_batch(rows, forks)
            if pool is not None and batch is not None and self.batch_bits.get(batch.key):
                batch.capture_over(pool)
        self._prepare_mixed(self.runners.mixed_batch_shapes() if warm else [], pool)
        pinned = autotune.pinned_dir()
        if shapes and pinned is not None:    # the batches' fla picks (some keyed by B) kept too,
            autotune.export(pinned)          # so another process runs the kernels checked here
        sizes = sorted({self.runners.batch_size(n) for n in chunk_batches} - {None})
        if not (sizes and self.runners.chunk.use_graphs and self.runners.batches_questions):
            return
        for size in sizes:                   # warmed up (eagerly), checked, captured over pool
            self.runners.chunk_batch(size).prepare()
        self.check_chunk_batches(sizes)
        for size in sizes:
            if pool is not None and self.chunk_bits.get(size):
                self.runners.chunk_batch(size).capture_over(pool)

    def _prepare_mixed(self, shapes, pool) -> None:
        """The mixed batches of `shapes` (each fork's rows, Runners.mixed_batch) warmed up,
        checked (`check_batches`) and, where they kept the bits, captured over `pool`, one at
        a time. One whose warm-up, check or capture raises is recorded as giving other bits
        (batch_bits False: its questions go a bucket's batch a step) with a RuntimeWarning
        naming the error, its runner and graphs dropped (`Runners.drop_mixed`; a later
        warm-up skips it), and the warm-up goes on: a mixed batch only speeds an ask up."""
        for rows in shapes:
            made = self.runners.mixed_rows(rows)     # the key's order: largest bucket first
            if made is None or self.batch_bits.get((len(made), made)) is False:
                continue                             # (one that failed is not made again)
            try:
                batch = self.runners.mixed_batch(made)
                batch.prepare()
                self.check_batches((), [made])
                if pool is not None and self.batch_bits.get(batch.key):
                    batch.capture_over(pool)
            except Exception as e:           # noqa: BLE001 (a bucket's batch a step stays)
                self.batch_bits[(len(made), made)] = False
                self.runners.drop_mixed(made)
                warnings.warn(f"the mixed question batch of {'+'.join(map(str, made))} rows "
                              f"failed its warm-up ({type(e).__name__}: {e}); such questions "
                              f"run a bucket's batch a step", RuntimeWarning, stacklevel=2)

    def check_batches(self, shapes, mixed=()) -> dict:
        """For each (rows, forks) shape and each mixed batch's rows, one batch of random forks
        over a scratch pool of their own (a shared prefix at 2,048 ids, where FA4 splits the
        keys, a page each, random states and ids) against each fork through its own runner,
        bit for bit (`_checked`; shapes checked before are skipped). shapes: (rows, forks)
        pairs, as Runners.question_batch takes them; mixed: each fork's rows, as
        Runners.mixed_batch takes them. Returns batch_bits ({BatchRunner.key: kept the bits}:
        (B, T), or (B, each fork's rows) for a mixed batch)."""
        from adapters.model.config import spec_for
        from block_store import KvPool, PagedKv
        m = self.model
        spec, g = spec_for(m.cfg, m.device, m.dtype), torch.Generator().manual_seed(0)
        dev_g = torch.Generator(device=m.device).manual_seed(0)
        pos = -(-2048 // self.grid) * self.grid
        batches = [self.runners.question_batch(rows, forks) for rows, forks in shapes] + \
            [self.runners.mixed_batch(rows) for rows in mixed]
        for batch in batches:
            if batch is None or batch.key in self.batch_bits:
                continue
            pool = KvPool(spec, self.grid, pos // self.grid + batch.num_seqs)
            pool.block.normal_(generator=dev_g)
            pages = [pool.manager.allocate().index for _ in range(pool.num_pages)]
            items = []
            for b, t in enumerate(batch.ts):
                ids = torch.randint(0, self.vocab_size, (t,), generator=g).tolist()
                gdn = [(torch.randn(spec.conv_dim, spec.conv_width, device=m.device,
                                    generator=dev_g).to(m.dtype),
                        torch.randn(*spec.recurrent_shape, device=m.device, generator=dev_g)
                        * 0.1) for _ in range(spec.num_gdn)]
                kv = PagedKv(pool, pages[:pos // self.grid] + [pages[pos // self.grid + b]])
                items.append((ids, pos, kv, gdn, [0]))
            self._checked(batch, items, pos)
        return self.batch_bits

    def read_chunks(self, items) -> list[GdnState]:
        """read_chunk for each item (ids, pos, kv, gdn): the grid chunks over one pool at
        positions of one FA4 split count (BatchRunner.splits) in one forward a group of up
        to the largest Runners.BATCH_SIZES (Runners.chunk_batch; a group short of its batch's
        size padded with copies of its last chunk, which write the same rows), each with the
        bits and states read_chunk gives it alone (`_checked_chunks`; a size not known to
        keep them, `_chunks_batchable`, runs one at a time, as do the others). Returns each
        chunk's new GDN states."""
        runners, out = self.runners, [None] * len(items)
        if len(items) < 2 or not runners.batches_questions or not any(
                self._chunks_batchable(b) for b in runners.BATCH_SIZES):
            return super().read_chunks(items)
        groups: dict = {}
        for i, (ids, pos, kv, _) in enumerate(items):
            groups.setdefault((id(kv.pool), runners.chunk_splits(pos)), []).append(i)
        most = runners.BATCH_SIZES[-1]
        for every in groups.values():
            for idx in (every[k:k + most] for k in range(0, len(every), most)):
                size = runners.batch_size(len(idx))
                batch = runners.chunk_batch(size) if size is not None else None
                if batch is None or not self._chunks_batchable(size):
                    for i in idx:
                        out[i] = self.read_chunk(*items[i])
                    continue
                group = [items[i] for i in idx]
                states = self._checked_chunks(batch, group + group[-1:] * (size - len(idx)))
                if self.chunk_bits[size]:
                    self.num_batched_forwards += 1
                    self.num_batched_chunks += len(idx)
                for i, gdn in zip(idx, states):
                    out[i] = gdn
        return out

    def chunk_group(self, positions: Sequence[int]) -> list[int]:
        """The indices of the grid chunks at `positions` that one read_chunks forward takes
        with the first: those at positions of its FA4 split count (Runners.chunk_splits), at
        most the largest Runners.BATCH_SIZES, where a chunk batch of their number keeps the
        bits (`_chunks_batchable`); else the first alone."""
        runners = self.runners
        if len(positions) < 2 or not runners.batches_questions:
            return [0][:len(positions)]
        s = runners.chunk_splits(positions[0])
        group = [i for i, p in enumerate(positions) if runners.chunk_splits(p) == s]
        group = group[:runners.BATCH_SIZES[-1]]
        size = runners.batch_size(len(group))
        return group if size is not None and self._chunks_batchable(size) else [0]

    def _chunks_batchable(self, size: int) -> bool:
        """Whether a batch of `size` grid chunks runs in one forward: with graphs, once
        check_chunk_batches found it keeps the bits; without, unless its first batch
        (checked then) gave other bits."""
        ok = self.chunk_bits.get(size)
        return ok is True if self.runners.chunk.use_graphs else ok is not False

    def check_chunk_batches(self, sizes: Sequence[int] | None = None) -> dict:
        """For each batch size (None: every Runners.BATCH_SIZES), one batch of random chunks over
        a scratch pool of their own (at 2,048 ids and above, where FA4 splits the keys, pages
        and states of their own) against each chunk through the chunk runner, bit for bit
        (`_checked_chunks`; sizes checked before are skipped). On CUDA only sizes checked here
        are batched (a check compiles and captures: the warm-up's work). Returns chunk_bits."""
        from adapters.model.config import spec_for
        from block_store import KvPool, PagedKv
        m, g = self.model, self.grid
        spec = spec_for(m.cfg, m.device, m.dtype)
        gen, dev_gen = torch.Generator().manual_seed(1), \
            torch.Generator(device=m.device).manual_seed(1)
        pos = -(-2048 // g) * g
        for size in self.runners.BATCH_SIZES if sizes is None else sizes:
            batch = self.runners.chunk_batch(size)
            if batch is None or size in self.chunk_bits:
                continue
            need = pos // g + 1
            pool = KvPool(spec, g, need * size)
            pool.block.normal_(generator=dev_gen)
            pages = [pool.manager.allocate().index for _ in range(pool.num_pages)]
            items = []
            for b in range(size):
                ids = torch.randint(0, self.vocab_size, (g,), generator=gen).tolist()
                gdn = [(torch.randn(spec.conv_dim, spec.conv_width, device=m.device,
                                    generator=dev_gen).to(m.dtype),
                        torch.randn(*spec.recurrent_shape, device=m.device, generator=dev_gen)
                        * 0.1) for _ in range(spec.num_gdn)]
                items.append((ids, pos, PagedKv(pool, pages[b * need:(b + 1) * need]), gdn))
            self._checked_chunks(batch, items)
        return self.chunk_bits

    def _checked_chunks(self, batch, items) -> list[GdnState]:
        """The chunks' new states from one forward of `batch`; at the first batch of its size,
        also each chunk through the chunk runner (run after, so the KV rows they leave are
        its), hidden rows, states and the KV rows each wrote compared bit for bit; where
        they differ, again with every part one call a chunk (batch.PER_FORK: where that
        differs too the size is recorded as differing, with a RuntimeWarning, and the chunks
        get the chunk runner's states), then the ways after the batch's in CHUNK_WAYS until
        one keeps the bits (the floor, PER_FORK, does)."""
        got = batch.read(items)
        size = batch.num_seqs
        if size in self.chunk_bits:
            return [gdn for _, gdn in got]

        def written() -> list:                 # each chunk's page, every layer's k and v
            return [[x[kv.pages[pos // kv.page_rows]].clone() for pair in kv.pool.layers()
                     for x in pair] for _, pos, kv, _ in items]

        def same(a, b) -> bool:                # (hidden, states, rows) of each chunk
            return all(torch.equal(h, h2) and all(torch.equal(x, y) for p, q in zip(s, s2)
                                                  for x, y in zip(p, q))
                       and all(torch.equal(x, y) for x, y in zip(r, r2))
                       for (h, s), r, (h2, s2), r2 in zip(*a, *b))

        def tried() -> tuple:                  # the batch's, then alone's (run after)
            mine = (got, written())
            own = [self.runners.chunk.run(*item) for item in items]
            return mine, (own, written())

        mine, theirs = tried()
        ok = same(mine, theirs)
        if not ok and batch.calls != PER_FORK:
            first = batch.calls
            batch.use(PER_FORK)                # the floor: only the projections over all rows
            got = batch.read(items)
            mine, theirs = tried()
            ok = same(mine, theirs)
            later = CHUNK_WAYS[CHUNK_WAYS.index(first) + 1:] if first in CHUNK_WAYS else ()
            found = False
            for way in later if ok else ():
                if way == PER_FORK:
                    break
                batch.use(way)
                got = batch.read(items)
                mine, way_theirs = tried()
                if same(mine, way_theirs):
                    theirs, found = way_theirs, True
                    break
            if not found:
                batch.use(PER_FORK)
        own = theirs[0]
        self.chunk_bits[size] = ok
        if not ok:
            warnings.warn(f"a batch of {size} grid chunks gave other bits than each alone on "
                          f"{self.model.device}; such batches run one chunk at a time in this "
                          f"process", RuntimeWarning, stacklevel=3)
        return [gdn for _, gdn in own]

    def graph_stats(self) -> dict:
        """Runners.captures: the runners, their graphs and what capturing them took; with
        `question_batch_bits` ({"BxT": whether a batch of B forks of T rows keeps each fork's
        bits, as checked; a mixed batch named by its forks' rows, "256+64", after them}),
        `question_batch_one_call` ({"BxT": {"attention", "recurrences", "conv", "rows", "norms",
        "down"}: whether each runs one call for all forks, BatchRunner.calls, batch.OneCall;
        None for a shape that runs one question at a time}), num_question_batches (questions'
        batches run in one forward; the checks not counted), `chunk_batch_bits` ({"B": whether a
        batch of B grid chunks keeps each chunk's bits, as checked}) and `chunk_batch_one_call`
        ({"B": the parts it runs in one call, or None})."""
        out = self.runners.captures()
        shapes = sorted((kv for kv in self.batch_bits.items() if isinstance(kv[0][1], int)),
                        key=lambda kv: kv[0]) + \
            sorted((kv for kv in self.batch_bits.items() if not isinstance(kv[0][1], int)),
                   key=lambda kv: kv[0][1])
        out["question_batch_bits"] = {shape_name(key): ok for key, ok in shapes}
        out["question_batch_one_call"] = {          # which parts run one call for all forks
            shape_name(key): dataclasses.asdict(self._batch_of(key).calls) if ok
            else None for key, ok in shapes}
        out["num_question_batches"] = self.num_question_batches
        out["chunk_batch_bits"] = {str(b): ok for b, ok in sorted(self.chunk_bits.items())}
        out["chunk_batch_one_call"] = {             # the way each size runs, as checked
            str(b): dataclasses.asdict(self.runners.chunk_batch(b).calls) if ok else None
            for b, ok in sorted(self.chunk_bits.items())}
        return out

    def _batch_of(self, key: tuple):
        """The question batch (Runners.question_batch or mixed_batch) of a batch_bits key."""
        b, t = key
        return self.runners.question_batch(t, b) if isinstance(t, int) else \
            self.runners.mixed_batch(t)

    def batches(self, lengths: Sequence[int] | None = None,
                positions: Sequence[int] | None = None,
                shared_rows: int | None = None) -> bool:
        """Whether questions' last forwards run in one forward here: with lengths, when there
        are 2 or more and all pad to one question bucket of at most Runners.BUCKET rows whose
        batches keep each fork's bits (`_batchable`), or to buckets that a mixed batch of
        theirs takes (Runners.mixed_batch: on CUDA the warmed ones, mixed_batch_shapes) and
        that keeps their bits; with positions, all at one; with shared_rows too, sharing
        enough rows for its FA4 call (BatchRunner.shares). Other questions of two buckets go
        a bucket's batch a step (fork.last_group), those of a shape whose batches gave other
        bits one a step, those at several positions a position's a step, so a step stays one
        forward (but for a shape's first batch off CUDA, checked against its forks alone, and
        forks at other positions given without positions, which fork_logits_batch runs a
        group a forward). Grid chunks never do here: `chunk_group` says which of them one
        read_chunks forward takes."""
        runners = self.runners
        if lengths is None:
            return runners.batches_questions
        if not runners.batches_questions or len(lengths) < 2 or \
                any(not 0 < n < self.grid for n in lengths) or len(set(positions or [0])) > 1:
            return False
        buckets = {runners.rows_of(n) for n in lengths}
        if len(buckets) > 1:                 # several buckets: a mixed batch (Runners)
            if self._mixed_rows(lengths) is None:
                return False
            made = lambda: runners.mixed_batch(lengths)     # noqa: E731
        else:
            t, size = buckets.pop(), runners.batch_size(len(lengths))
            if size is None or t > runners.BUCKET or not self._batchable((size, t)):
                return False
            made = lambda: runners.question_batch(t, size)  # noqa: E731
        # the batch itself (made now, for the step that asked) only to ask whether its forks
        # share the rows its FA4 call reads once
        return shared_rows is None or not positions or made().shares(positions[0], shared_rows)

    def _mixed_rows(self, lengths: Sequence[int]) -> tuple[int, ...] | None:
        """Runners.mixed_rows of questions of these lengths where their mixed batch runs in
        one forward here (`_batchable`), else None."""
        rows = self.runners.mixed_rows(lengths)
        return rows if rows is not None and self._batchable((len(rows), rows)) else None

    def _mixed(self, lengths: Sequence[int]):
        """The mixed batch of questions of these lengths (Runners.mixed_batch) where it runs
        in one forward here (`_mixed_rows`), else None; a shape not warmed up on CUDA is not
        even made (its buffers would never serve)."""
        return self.runners.mixed_batch(lengths) if self._mixed_rows(lengths) else None

    def _batchable(self, key: tuple) -> bool:
        """Whether a batch of the shape `key` (BatchRunner.key: (B, t) or (B, each fork's
        rows)) runs in one forward: with graphs, once `prepare` warmed it up and its check
        kept the bits; without, unless its first batch (checked then) gave other bits."""
        ok = self.batch_bits.get(key)
        return ok is True if self.runners.chunk.use_graphs else ok is not False

    def fork_logits_batch(self, items, shared_rows: int = 0) -> list[torch.Tensor]:
        """fork_logits for each item (ids, pos, kv, gdn, token_ids): the items at one pos over one
        pool in one forward where a mixed batch of their buckets keeps their bits
        (Runners.mixed_batch), else those whose ids pad to one bucket (Runners.rows_of) in
        one forward a group of up to the largest Runners.BATCH_SIZES
        (Runners.question_batch; a group short of its batch's size padded with copies of its
        last fork, which write the same rows), each with the bits fork_logits gives it alone
        (`_checked`; a shape not known to keep them, `_batchable`, or forks sharing too few
        rows for its FA4 call, BatchRunner.shares, runs one at a time, as do the others).
        shared_rows: as Adapter.fork_logits_batch. Returns [len(token_ids)] fp32 each.
        Every item's letters go to the device in one copy before any forward: a blocking
        copy after one would hold the host until it ended (7.2 of ask_many's 11.1 ms in
        cProfile on an H100, four letters' copies after the forward:
        docs/batch-bench-ask-profile-h100-2026-12-07.log)."""
        items = list(items)
        flat = self._ids([t for *_, token_ids in items for t in token_ids])
        letters = torch.split(flat, [len(token_ids) for *_, token_ids in items])
        items = [(list(ids), pos, kv, gdn, held)
                 for (ids, pos, kv, gdn, _), held in zip(items, letters)]
        places: dict = {}
        for i, (ids, pos, kv, *_) in enumerate(items):
            places.setdefault((pos, id(kv.pool)), []).append(i)
        out: list = [None] * len(items)
        for (pos, _), every in places.items():
            lengths = [len(items[i][0]) for i in every]
            mixed = self._mixed(lengths)
            if mixed is not None and mixed.shares(pos, shared_rows):   # every bucket's in one
                idx = [every[k] for k in self.runners.mixed_order(lengths)]
                self._logits_of(mixed, items, idx, shared_rows, out)
                continue
            groups: dict = {}
            for i in every:
                groups.setdefault(self.runners.rows_of(len(items[i][0])), []).append(i)
            for rows, same in groups.items():
                self._bucket_logits(rows, same, items, pos, shared_rows, out)
        return out

    def _bucket_logits(self, rows: int, every: list[int], items, pos: int, shared_rows: int,
                       out: list) -> None:
        """fork_logits_batch's forks `every` (indices into items) of one bucket of `rows`
        rows at pos: into out, a batch of up to the largest BATCH_SIZES a forward where one
        keeps their bits, else one at a time."""
        most = self.runners.BATCH_SIZES[-1]
        for idx in (every[k:k + most] for k in range(0, len(every), most)):
            batch = self.runners.question_batch(rows, len(idx))
            if batch is None or not self._batchable(batch.key) or \
                    not batch.shares(pos, shared_rows):
                for i in idx:
                    out[i] = self.fork_logits(*items[i])
                continue
            self._logits_of(batch, items, idx + idx[-1:] * (batch.num_seqs - len(idx)),
                            shared_rows, out)

    def _logits_of(self, batch, items, idx: list[int], shared_rows: int, out: list) -> None:
        """The forks items[i] for i in idx (in the batch's order; a fork repeated fills a
        batch) in one forward of `batch` (`_checked`): each one's letters' logits into
        out[i] (each item's letters on the device already: fork_logits_batch)."""
        hidden = self._checked(batch, [items[i] for i in idx], shared_rows)
        self.num_question_batches += self.batch_bits[batch.key]
        for i, h in zip(idx, hidden):
            n = len(items[i][0])
            out[i] = self.model.logits(h[n - 1:n], items[i][4])[0].float()

    def _checked(self, batch, items, shared_rows: int) -> list[torch.Tensor]:
        """The forks' hidden rows [t, hidden] (each fork its batch.ts' rows) from one forward
        of `batch` (the forks sharing rows [0, shared_rows), BatchRunner.run); at the first
        batch
        of its shape, also from each fork's own runner (run after, so the KV rows they leave
        are its), compared bit for bit over all t rows (the real ones and the padding, the
        same ids in both). Where they differ, the batch is run and compared again with
        every part one call a fork (batch.PER_FORK: where that differs too, the ops
        over all rows that every way runs do, and the shape is recorded in batch_bits as
        differing, with a RuntimeWarning, and its forks get their own runner's rows), then
        the ways after the first (BatchRunner.fall_back, OneCall.fallback's order) until
        one keeps the bits."""
        key = batch.key
        padded = [(ids + [ids[-1]] * (t - len(ids)), pos, kv, gdn)
                  for (ids, pos, kv, gdn, _), t in zip(items, batch.ts)]
        hidden = batch.run(padded, shared_rows)
        if key in self.batch_bits:
            return hidden

        def alone() -> list[torch.Tensor]:
            return [self.runners.for_rows(len(ids)).run(torch.tensor(ids, dtype=torch.long),
                                                        pos, kv, gdn)[0]
                    for ids, pos, kv, gdn in padded]

        def tried() -> tuple[list, list, bool]:   # the batch, then its forks alone (after,
            got = batch.run(padded, shared_rows)    # so the KV rows are theirs again)
            own = alone()
            return got, own, all(torch.equal(a, b) for a, b in zip(own, got))

        rows = alone()
        same = all(torch.equal(a, b) for a, b in zip(rows, hidden))
        if not same and batch.calls != PER_FORK:
            # the floor first: one call a fork, only the ops over all rows can differ from
            # alone, and every way runs them; where it differs, so does every way
            first = batch.calls
            batch.use(PER_FORK)
            hidden, rows, same = tried()
            if same:                                # some way keeps the bits: the first of
                floor = hidden                      # them after `first` (OneCall.fallback)
                batch.use(first)
                found = False
                while batch.fall_back() and batch.calls != PER_FORK:
                    hidden, rows, found = tried()
                    if found:
                        break
                if not found:
                    batch.use(PER_FORK)
                    hidden = floor
        self.batch_bits[key] = same
        if not same:
            shape = f"{batch.t} rows" if batch.t is not None else \
                f"{'+'.join(map(str, batch.ts))} rows"
            warnings.warn(f"a batch of {key[0]} questions of {shape} gave other bits than "
                          f"each alone on {self.model.device}; such batches run one question "
                          f"at a time in this process", RuntimeWarning, stacklevel=3)
            return rows
        return hidden

    def kernel_picks(self) -> str:
        """The chunk runner's picks, digested at its warm-up (ChunkGraphs.prepare, run now if
        it has not run): on CUDA the reader's construction warms the chunk runner up."""
        chunk = self.runners.chunk
        if self.kernels.name != "fla" or not chunk.use_graphs:
            return super().kernel_picks()
        with self.on_device():
            chunk.prepare()
        return chunk.picks

    def read_chunk(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        _, new = self.runners.run(ids, pos, kv, gdn)    # the runner stages host ids itself
        return new

    def read_rows(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        """Through the states-keeping runner of exactly len(ids) rows (Runners.rows: one a
        multiple of ROW_ALIGN below the grid, no padding). Raises as Adapter.read_rows."""
        check_rows(len(ids), pos, self.grid)
        _, new = self.runners.rows(len(ids)).run(ids, pos, kv, gdn)
        return new

    def fork_rows(self, num_ids: int) -> int:
        runner = self.runners.for_rows(num_ids)
        return runner.t if runner is not None else num_ids

    def fork_logits(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState,
                    token_ids: Sequence[int]) -> torch.Tensor:
        """Through the runner of the ids' length bucket, padded after the real rows (into
        scratch rows above them, which change none of the real rows' values); eagerly past
        the largest bucket. token_ids: a sequence of ints, or [L] int64 on the device
        (fork_logits_batch's)."""
        ids = list(ids)
        letters = token_ids if isinstance(token_ids, torch.Tensor) else \
            self._ids(token_ids)            # before the forward: a blocking copy after it
        runner = self.runners.for_rows(len(ids))   # would hold the host until it ends
        if runner is not None:
            padded = torch.tensor(ids + [ids[-1]] * (runner.t - len(ids)), dtype=torch.long)
            hidden, _ = runner.run(padded, pos, kv, gdn)
            hidden = hidden[len(ids) - 1:len(ids)]
        else:
            hidden, _ = self.model(self._ids(ids), pos, kv, gdn)
        return self.model.logits(hidden[-1:], letters)[0].float()

    def decode_burst(self, token: int, pos: int, kv: PagedKv, gdn: GdnState, max_steps: int,
                     stop_ids: set[int]) -> tuple[list[int], int, GdnState]:
        """Through the decode loop (adapters.runners.decode: the single-token runner, each token
        fed back on the device); the states are copied out of the runner (another fork may
        run it next)."""
        loop = self.runners.decode_loop()
        out, steps = loop.run(token, pos, kv, gdn, max_steps, stop_ids)
        return out, steps, loop.states()
