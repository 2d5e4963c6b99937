"""A reader's runners (runners.graphs.ChunkGraphs): grid chunks (what commits state), questions
padded to row buckets (64 and 128 rows, `small_bucket_rows`, then multiples of 256), single-token
decode and its device-fed loop (runners.decode)."""
from __future__ import annotations

import operator
from collections.abc import Iterable

from adapters.attention.fa4_plan import SUB_PAGE
from adapters.model import ops, rowwise
from adapters.runners import capture
from adapters.runners.batch import shape_name
from adapters.runners.graphs import ChunkGraphs


class Runners:
    """A reader's chunk runners: `chunk` for grid chunks (what commits state), and lazily one
    per question length bucket (`for_rows`: forwards padded to the first of
    `small_bucket_rows` that holds them, else to a multiple of BUCKET rows, at most MAX_ROWS;
    their runs give back the hidden rows and no states, ChunkGraphs' return_states: with FA4
    in the graph their graphs keep none) and one for single-token decode steps (`decode`;
    with the table attention its attention.tiling.DECODE tiling), with its device-fed loop
    (`decode_loop`).
    Every runner is a ChunkGraphs with the same options (on CUDA one side stream for their
    warm-ups); `run` is the chunk runner's.

    small_bucket_rows: row counts below BUCKET, ascending, multiples of 64 (FA4 reads rows in
    64-row sub-pages, fa4_plan.SUB_PAGE), e.g. (64, 128): a short question pads to fewer rows,
    so it computes less and FA4 splits the keys more ways (up to 33 splits at 64 rows on an
    H200, fa4_plan.all_splits). A question's bits depend on its bucket (not committed state:
    a question at C and below C with the same rows use the same runner). Default (None):
    those of SMALL_BUCKET_ROWS, (64, 128), below BUCKET. On an H200 the 9-class question at
    C (69 ids: 128 rows) took 12-14 % less at 32k and 22 % less at 100k than with 256 rows,
    and 16 % less at 32k than the contiguous tree's, which pads to 256 rows (BENCHMARKS.md,
    docs/pages-ab-buckets-*-2026-12-02*.log). () for none. Raises ValueError for buckets
    that are not such row counts, or a tiling of another attention.

    row_invariant: the chunk runner's row-wise reductions through model.rowwise
    (ops.rowwise_chunk_ops: its norms, q/k heads, GDN gates and gated norm), so that a batch
    of grid chunks (`chunk_batch`) runs them over all its rows and keeps each chunk's bits
    (another path, `path`: other bits than the compiled ops'). Default (None): on CUDA with
    the compiled ops where model.rowwise takes the model's heads, else off (the compiled or
    eager ops; a chunk batch runs them one call a chunk). On an H100 a 512-id chunk alone
    read 6.8 % faster at 16k and 6.1 % at 64k this way than with the compiled ops, and four
    chunks in one forward 1.39x / 1.24x faster than one at a time against 1.19x / 1.12x,
    every chunk exact (evals/bi_bench.py --chunk-ops compiled,rowwise,
    docs/bi-bench-chunks-rowwise-h100-2026-12-06-b.log). Raises ValueError for True with a
    model whose heads model.rowwise does not take."""

    BUCKET = 256
    MAX_ROWS = 4096
    SMALL_BUCKET_ROWS = (64, 128)
    # forks a question batch holds (Runners.question_batch): a few shapes, each a set of
    # compiled ops and graphs, instead of one per count
    BATCH_SIZES = (2, 4, 8)
    # short questions a reader's warm-up prepares beside one of BUCKET rows in one forward
    # (mixed_batch_shapes): the router question (182 ids with its 9 choices: 256 rows) and
    # up to 3 classifications of one small bucket, as one ask_many sends them
    MIXED_SMALL = 3

    def __init__(self, model, grid: int, attention: str | None = None, fused: bool | None = None,
                 split=None, small_bucket_rows: tuple[int, ...] | None = None,
                 row_invariant: bool | None = None):
        self.model = model
        if split is not None and attention is None:      # a tiling is the table attention's
            attention = "table"
        if split is not None and attention != "table":
            raise ValueError(f"a tiling ({split}) is the table attention's; attention "
                             f"{attention!r} has none")
        if small_bucket_rows is None:          # the default: those below this class's BUCKET
            small_bucket_rows = [r for r in self.SMALL_BUCKET_ROWS if r < self.BUCKET]
        self.small_bucket_rows = check_small_bucket_rows(small_bucket_rows, self.BUCKET)
        # one stream for every runner's warm-ups: one cuBLAS workspace (runners.capture)
        side = capture.new_side_stream(model.device)
        if row_invariant is None:
            row_invariant = row_invariant_default(model, fused)
        self.row_invariant = row_invariant
        self.chunk = ChunkGraphs(model, grid, attention, fused, split, keep_states=True,
                                 page_rows=grid, side_stream=side,
                                 op_set=self._chunk_ops(fused) if row_invariant else None)
        self.options = {"attention": attention, "op_set": self.chunk.ops,     # one compiled set
                        "proj": self.chunk.proj, "page_rows": grid, "side_stream": side}
        self.split = split
        # question runners by rows, the decode runner (1), states-keeping runners ('rows', t)
        self._sized: dict = {}
        self._pool = None                 # the reader's KV pool, once `prepare` was given it
        self._loop = None
        self._batches: dict = {}          # (t, B) or ("mixed", rows) -> batch.BatchRunner
        self._chunk_batches: dict = {}    # B -> the BatchRunner of B grid chunks
        # the captures of batches dropped after a failed warm-up (drop_mixed), for `captures`
        self._dropped = {"num_captures": 0, "num_failed_captures": 0, "capture_s": 0.0}
        self._chunk_slots: list = []      # the chunk batches' state slots (chunk_slots)
        self._slots: list = []            # the question batches' state slots (batch_slots)

    def _chunk_ops(self, fused: bool | None) -> ops.Ops:
        """The chunk runner's op set with row_invariant: ops.rowwise_chunk_ops over the op set
        ChunkGraphs would pick (the compiled ops with graphs, else the eager ones). Raises
        ValueError for a model whose heads model.rowwise does not take."""
        if not rowwise.fits(self.model.cfg):
            raise ValueError("row-invariant chunks: model.rowwise takes head dims that are "
                             "powers of two and an even rotary dim within head_dim; this "
                             f"model has head_dim {self.model.cfg.head_dim}, rotary_dim "
                             f"{self.model.cfg.rotary_dim}")
        graphs = self.model.device.type == "cuda"
        return ops.rowwise_chunk_ops(ops.fused_ops() if (graphs if fused is None else fused)
                                     else ops.EAGER)

    @property
    def path(self) -> str:
        """What the committed bits depend on beyond the model: 'graphs:fa4 VERSIONS paged64'
        (flash-attn-4's and its compiler's, attention.fa4.package_version; read in 64-row sub-pages
        with a 64-row key tile), 'graphs:table BMxBNxWxS' or 'eager:sdpa', then '+fused'
        (the compiled small ops), '+conv' (the GDN conv compiled with them,
        ops.fused_ops(compile_conv=True)), '+rowwise2' (the row-wise reductions row-invariant,
        ops.rowwise_chunk_ops; model.rowwise.PATH_TAG) and '+proj' (fused projections) (written
        into spilled files: another path, other bits)."""
        c = self.chunk
        kind = f"{'graphs' if c.use_graphs else 'eager'}:{c.attention}"
        if c.table:
            s = c.split
            kind += f" {s.block_m}x{s.block_n}x{s.num_warps}x{s.num_stages}"
        elif c.attention == "fa4":                     # its kernels' code: the package's
            from adapters.attention.fa4 import SUB_PAGE, package_version
            kind += f" {package_version()} paged{SUB_PAGE}"
        eager = c.ops.swiglu is ops.EAGER.swiglu               # (rowwise keeps it)
        fused = "" if eager else "+fused" + ("+conv" if c.ops.conv_gates else "")
        return kind + fused + (rowwise.PATH_TAG if self.row_invariant else "") + \
            ("+proj" if c.proj else "")

    def run(self, ids, pos: int, kv: list, gdn: list):
        """ChunkGraphs.run of the grid chunk runner."""
        return self.chunk.run(ids, pos, kv, gdn)

    def _get(self, t: int, split) -> ChunkGraphs:
        if t == self.chunk.t and split is self.split:    # a grid-sized bucket: the chunk runner
            return self.chunk
        # a question's states are not given back (fork_logits): its graphs hold none
        return self._made(t, t, split, return_states=False, op_set=self.question_ops(t))

    def question_ops(self, t: int):
        """The op set of the question runner of t rows: on CUDA with the compiled ops, for a
        bucket that batches (at most BUCKET rows) and a model model.rowwise takes, the
        row-wise ops and the MLP's down projection row-invariant (ops.row_invariant_ops: a
        batch of its questions gives each the bits it gets alone, runners.batch; over the
        chunk runner's ops, so with row_invariant its norms are model.rowwise's too);
        else the chunk runner's."""
        c = self.chunk
        if c.use_graphs and c.ops is not ops.EAGER and t <= self.BUCKET and \
                rowwise.fits(self.model.cfg):
            return ops.row_invariant_ops(c.ops)
        return c.ops

    def rows(self, t: int) -> ChunkGraphs:
        """The runner of a fork's piece of exactly t rows that gives back its states (t a
        multiple of 64 below the grid: Adapter.read_rows), made at first use (its graphs
        too; with FA4 in the graph over the pool `prepare` was given)."""
        return self._made(("rows", t), t, self.split)

    def _made(self, key, t: int, split, **kw) -> ChunkGraphs:
        """The runner kept under `key` (a ChunkGraphs of t rows with the runners' options,
        kw over them), made now if it is not: with FA4 in the graph, its graphs over the
        reader's pool once `prepare` was given it (made at first use)."""
        if key not in self._sized:
            runner = self._sized[key] = ChunkGraphs(self.model, t, split=split,
                                                    **{**self.options, **kw})
            if runner.split_graphs is not None and self._pool is not None:
                runner.split_graphs.pin(self._pool)
        return self._sized[key]

    def question_batch(self, num_rows: int, num_seqs: int):
        """The runner of question forks of num_rows ids each (padded as `for_rows` pads them)
        in one forward (runners.batch.BatchRunner over that bucket's runner) that
        holds num_seqs of them: BATCH_SIZES' first size at or above num_seqs (a caller fills
        the rest with copies of a fork), made at first use; None where questions are not
        batched: fewer than 2 forks, more than the largest size, a bucket past BUCKET rows, or
        an attention BatchRunner does not take (the table attention). The batches share one
        set of state slots (`batch_slots`)."""
        t, size = self.rows_of(num_rows), self.batch_size(num_seqs)
        if size is None or t > self.BUCKET or not self.batches_questions:
            return None
        key = (t, size)
        if key not in self._batches:
            from adapters.runners.batch import BatchRunner
            batch = self._batches[key] = BatchRunner(self._get(t, self.split),
                                                       self.batch_slots(size))
            if batch.split_graphs is not None and self._pool is not None:
                batch.split_graphs.pin(self._pool)          # the reader's pool, as _made
        return self._batches[key]

    def mixed_batch(self, num_rows):
        """The runner of question forks of two or more buckets in one forward (runners.batch.
        BatchRunner over a runner a fork: the ops over all rows once, FA4, the conv and the
        recurrences one call a bucket), for forks of num_rows ids each (a sequence), padded
        as `for_rows` pads them and ordered by bucket, largest first, as `mixed_order` gives
        them (no copies fill it: a batch a composition); made at first use; None where they
        are not so batched (`mixed_rows`)."""
        rows = self.mixed_rows(num_rows)
        if rows is None:
            return None
        key = ("mixed", rows)
        if key not in self._batches:
            from adapters.runners.batch import BatchRunner
            batch = self._batches[key] = BatchRunner([self._get(t, self.split) for t in rows],
                                                     self.batch_slots(len(rows)))
            if batch.split_graphs is not None and self._pool is not None:
                batch.split_graphs.pin(self._pool)
        return self._batches[key]

    def drop_mixed(self, num_rows) -> None:
        """Forget the mixed batch of forks of num_rows ids (its buffers and graphs freed once
        nothing else holds it): one whose warm-up failed never runs."""
        rows = self.mixed_rows(num_rows)
        gone = self._batches.pop(("mixed", rows), None) if rows is not None else None
        if gone is not None:                  # its captures still counted (`captures`)
            for name in self._dropped:
                self._dropped[name] += gone.captures()[name]

    def mixed_rows(self, num_rows) -> tuple[int, ...] | None:
        """The rows of each fork of `mixed_batch(num_rows)`, largest first (its key, without
        making it), or None where no mixed batch takes forks of num_rows ids: fewer than 2
        buckets, more forks than BATCH_SIZES' largest, a bucket past BUCKET rows or past the
        grid, a grid-sized bucket (the chunk runner's) whose op set is not the other
        buckets' (on CUDA the question runners' row-invariant ops, `question_ops`), or
        questions not batched here (`question_batch`)."""
        rows = tuple(sorted((self.rows_of(n) for n in num_rows), reverse=True))
        if len(set(rows)) < 2 or len(rows) > self.BATCH_SIZES[-1] or rows[0] > self.BUCKET \
                or rows[0] > self.chunk.t or not self.batches_questions:
            return None
        if rows[0] == self.chunk.t and self.question_ops(rows[-1]) is not self.chunk.ops:
            return None
        return rows

    def mixed_order(self, num_rows) -> list[int]:
        """The forks' places in `mixed_batch`: indices into num_rows by bucket, largest first
        (in their order within a bucket)."""
        return sorted(range(len(num_rows)), key=lambda i: -self.rows_of(num_rows[i]))

    def mixed_batch_shapes(self) -> list[tuple[int, ...]]:
        """The mixed batches a reader's warm-up prepares (each fork's rows, `mixed_batch`): one
        of BUCKET rows beside 1 to MIXED_SMALL of one small bucket (a short question pads to
        64 rows with a kept tail, to 128 with a tail of up to 64 ids before it), those that
        `mixed_rows` takes here; none without small buckets."""
        shapes = [(self.BUCKET,) + (small,) * k for small in self.small_bucket_rows
                  for k in range(1, self.MIXED_SMALL + 1)]
        return [rows for rows in shapes if self.mixed_rows(rows) is not None]

    def chunk_batch(self, num_seqs: int):
        """The runner of num_seqs grid chunks of several sequences in one forward (issue 36,
        item 2): a runners.batch.BatchRunner over the chunk runner (its ops, its
        attention, its bits) whose forks sit at their own positions of one FA4 split count
        and whose slots return states (`chunk_slots`), run the way `chunk_way` gives (the
        graph adapter's check may take a later way of batch.CHUNK_WAYS), made at first use;
        None where chunks are not batched (as question_batch, or num_seqs not one of
        BATCH_SIZES: a caller fills a batch itself)."""
        if num_seqs not in self.BATCH_SIZES or not self.batches_questions:
            return None
        if num_seqs not in self._chunk_batches:
            from adapters.runners.batch import BatchRunner
            batch = self._chunk_batches[num_seqs] = BatchRunner(
                self.chunk, self.chunk_slots(num_seqs), self.chunk_way(), one_position=False)
            if batch.split_graphs is not None and self._pool is not None:
                batch.split_graphs.pin(self._pool)
        return self._chunk_batches[num_seqs]

    def chunk_way(self):
        """The way a batch of grid chunks starts (a batch.OneCall): with row-invariant chunk
        ops, or the eager ops without graphs (the CPU: the check at the first batch decides),
        every part but FA4 in one call (batch.chunk_way(True)); with torch.compile's, the
        norms and row-wise ops one call a chunk (batch.chunk_way(False))."""
        from adapters.runners.batch import chunk_way
        return chunk_way(self.row_invariant or not self.chunk.use_graphs)

    def chunk_splits(self, pos: int) -> int:
        """FA4's split count S of a grid chunk at pos (fa4_plan.split_plan; a chunk batch's
        chunks share one); 0 with another attention."""
        between = self.chunk._between
        return between.num_splits(pos, self.chunk.t, self.model.device) if between else 0

    def chunk_slots(self, num_seqs: int) -> list:
        """The first num_seqs of the chunk batches' state slots (StateSlots that return
        states, made for the largest BATCH_SIZES at the first ask, their inputs in one block
        per layer as `batch_slots`'). Raises ValueError for more than that size."""
        from adapters.runners.slots import StateSlots
        m, most = self.model, self.BATCH_SIZES[-1]
        if num_seqs > most:
            raise ValueError(f"chunk batches hold at most {most} chunks, got {num_seqs}")
        if not self._chunk_slots:
            self._chunk_slots = StateSlots.block(m.cfg, m.device, m.dtype, most)
        return self._chunk_slots[:num_seqs]

    def batch_size(self, num_seqs: int) -> int | None:
        """The forks a question batch of num_seqs holds: BATCH_SIZES' first at or above it;
        None for fewer than 2 or more than the largest."""
        if num_seqs < 2:
            return None
        return next((b for b in self.BATCH_SIZES if b >= num_seqs), None)

    def batch_slots(self, num_seqs: int) -> list:
        """The first num_seqs of the question batches' state slots (runners.slots.StateSlots
        that return none; 19.8 MB each on the 0.8B), the largest BATCH_SIZES' made at the
        first ask (158 MB on the 0.8B), their inputs one after another in one tensor per
        layer (StateSlots.block: a batch reads its forks' states as one view, slots.stacked):
        every batch feeds its forks' states into them before it runs, so batches of any
        shape share them. Raises ValueError for more than that size."""
        from adapters.runners.slots import StateSlots
        m, most = self.model, self.BATCH_SIZES[-1]
        if num_seqs > most:
            raise ValueError(f"question batches hold at most {most} forks, got {num_seqs}")
        if not self._slots:
            self._slots = StateSlots.block(m.cfg, m.device, m.dtype, most, returned=False)
        return self._slots[:num_seqs]

    @property
    def batches_questions(self) -> bool:
        """Whether `question_batch` makes batches here: FA4 over its device-built tables
        (runners.fa4_graph; inside the graph on CUDA) or SDPA without graphs (the CPU); not
        the table attention."""
        c = self.chunk
        return (c.attention == "fa4" and c.split_graphs is not None) or \
            (c.attention == "sdpa" and not c.use_graphs)

    def captures(self) -> dict:
        """The runners made so far and their CUDA graphs: num_runners; num_graphs (held now);
        num_captures, num_failed_captures and capture_s (seconds) since the start (the
        captures at first use, after `prepare`, included: each syncs the device; the decode
        loop's own tail graph included in num_graphs once captured); the row counts of the
        question runners (`question_rows`; a question padded to the grid runs on the chunk
        runner, not listed), of the states-keeping ones (`kept_rows`: Runners.rows, a
        fork's tail) and the question batches' "BxT" (`question_batches`: B forks of T
        rows, question_batch; a mixed batch's rows joined by "+", mixed_batch) and the chunk
        batches' B (`chunk_batches`, `chunk_batch`; their graphs counted with the others).
        All 0 without graphs."""
        out = {"num_runners": 0, "num_graphs": 0, "num_captures": 0,
               "num_failed_captures": 0, "capture_s": 0.0, "question_rows": [],
               "kept_rows": [], "question_batches": [],
               "chunk_batches": sorted(self._chunk_batches), **self._dropped}
        plain = sorted((key, b) for key, b in self._batches.items() if key[0] != "mixed")
        mixed = sorted(((key, b) for key, b in self._batches.items() if key[0] == "mixed"),
                       key=lambda kb: kb[0][1])
        batches = [(("batch",) + key, b) for key, b in plain + mixed]
        chunks = [("chunks", b) for _, b in sorted(self._chunk_batches.items())]
        for key, runner in [("chunk", self.chunk), *self._sized.items(), *batches, *chunks]:
            for name, value in runner.captures().items():
                out[name] += value
            out["num_runners"] += 1
            if isinstance(key, tuple) and key[0] == "batch":
                out["question_batches"].append(shape_name(runner.key))
            elif isinstance(key, tuple):
                out["kept_rows"].append(key[1])
            elif isinstance(key, int) and key > 1:
                out["question_rows"].append(key)
        if self._loop is not None and self._loop.graph is not None:     # the decode loop's
            out["num_graphs"] += 1
            out["num_captures"] += 1
        out["capture_s"] = round(out["capture_s"], 3)
        out["question_rows"].sort()
        out["kept_rows"].sort()
        return out

    def rows_of(self, num_rows: int) -> int:
        """The rows a forward of num_rows ids is padded to: the first small bucket that holds
        them, else the next multiple of BUCKET."""
        for t in self.small_bucket_rows:
            if num_rows <= t:
                return t
        return -(-num_rows // self.BUCKET) * self.BUCKET

    def question_bucket_rows(self) -> list[int]:
        """The row counts `prepare` captures by default: the small buckets, then the first 4
        multiples of BUCKET (what the 9-class question with a tail below one 512-id chunk
        needs)."""
        return list(self.small_bucket_rows) + [self.BUCKET * k for k in range(1, 5)]

    def for_rows(self, num_rows: int) -> ChunkGraphs | None:
        """The runner for a forward of num_rows ids padded up to `rows_of(num_rows)` rows
        (None past MAX_ROWS: forward eagerly). Padded rows come after the real ones, so they
        change none of the real rows' values; a runner's size depends only on num_rows."""
        t = self.rows_of(num_rows)
        return self._get(t, self.split) if t <= self.MAX_ROWS else None

    def question_batch_shapes(self) -> list[tuple[int, int]]:
        """(rows, forks) of the question batches a reader's warm-up prepares: every
        BATCH_SIZES at every small bucket (the short questions of one ask)."""
        return [(t, b) for t in self.small_bucket_rows for b in self.BATCH_SIZES]

    def prepare(self, question_rows=None, pool=None, kept_rows=(), question_batches=()) -> None:
        """Capture the chunk runner, the decode runner, the question runners for these row
        counts (default: `question_bucket_rows()`) and the states-keeping runners of
        kept_rows (`rows`: a fork's tails; with FA4 in the graph one graph per split count
        each, 50 for 128-448 rows on an H100's 132 SMs by the split counts they can meet (16
        and 11 of them at 128 and 192 rows), each holding its output GDN states: 19.8 MB on
        the 0.8B, about 0.99 GB in all, an estimate, not measured); with FA4 in the graph and
        `pool` (the reader's block_store.KvPool) given, their graphs over that pool
        (ChunkGraphs.prepare); and the question batches of question_batches ((rows, forks)
        pairs, `question_batch`) warmed up (their graphs: BatchRunner.capture_over, after
        their check, adapters.graphed.GraphAdapter.prepare, which warms the mixed batches up
        too)."""
        if pool is not None:
            self._pool = pool
        self.chunk.prepare(pool)
        self.decode_loop().prepare()
        for rows in question_rows or self.question_bucket_rows():
            runner = self.for_rows(rows)
            if runner is not None:
                runner.prepare(pool)
        for rows in kept_rows:
            self.rows(rows).prepare(pool)
        for rows, forks in question_batches:
            batch = self.question_batch(rows, forks)
            if batch is not None:
                batch.prepare()

    def decode_loop(self):
        """runners.decode.DecodeLoop over the decode runner (its tail graph captured once)."""
        if self._loop is None:
            from adapters.runners.decode import DecodeLoop
            self._loop = DecodeLoop(self.model, self.decode())
        return self._loop

    def decode(self) -> ChunkGraphs:
        """The single-token runner (on CUDA the table attention with its split for one query
        row, inside the graph: FA4 wastes a 128-row tile on one row, and torch's
        FlashAttention-2 reads no page table; its projections through model.gemv,
        ops.decode_ops)."""
        if 1 not in self._sized:
            from adapters.attention.tiling import DECODE
            options = dict(self.options)
            if self.chunk.use_graphs and self.chunk.ops is not ops.EAGER:
                options["op_set"] = ops.decode_ops(self.chunk.ops)
            table = self.chunk.table or self.chunk.attention == "fa4"
            if table:
                options["attention"] = "table"
            self._sized[1] = ChunkGraphs(self.model, 1, split=DECODE if table else None,
                                         **options)
        return self._sized[1]


def row_invariant_default(model, fused: bool | None = None) -> bool:
    """Runners' row_invariant when not given: on CUDA unless the compiled ops are turned off
    (fused False), where model.rowwise takes the model's heads."""
    return model.device.type == "cuda" and fused is not False and rowwise.fits(model.cfg)


def check_small_bucket_rows(rows, bucket_rows: int) -> tuple[int, ...]:
    """`rows` (an iterable of integers, numpy's included) as a tuple of ints if they are
    ascending multiples of fa4_plan.SUB_PAGE below `bucket_rows`. Raises ValueError naming
    what is wrong (also for a single number or a string)."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise ValueError(f"small question bucket rows are a sequence of row counts, e.g. "
                         f"(64, 128); got {rows!r}")
    out = []
    for r in rows:
        try:
            n = operator.index(r) if not isinstance(r, bool) else None
        except TypeError:
            n = None
        if n is None or n <= 0 or n % SUB_PAGE or n >= bucket_rows:
            raise ValueError(f"a small question bucket is a positive multiple of {SUB_PAGE} "
                             f"rows below {bucket_rows}; got {r!r} in {tuple(rows)}")
        out.append(n)
    if out != sorted(set(out)):
        raise ValueError(f"small question buckets go up, each once; got {tuple(out)}")
    return tuple(out)
