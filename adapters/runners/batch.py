"""B sequences' forwards of t rows each in one forward (issue 36), through one CUDA graph per
number of FA4 splits on CUDA, eagerly on the CPU (tests/kernels runs the FA4 body there over a
pure-torch fake of the package):
- several questions' last forwards over one session (item 3): B forks at one position, t rows
  each (a question runner's bucket, runners.runners), which share the session's rows below it
  (Runners.question_batch); or forks of several buckets, a runner a fork (Runners.mixed_batch:
  the router question's 256 rows beside short classifications' 64 or 128), where the ops
  over all rows run once and FA4 (each bucket its own split count, fa4_plan.split_plan: at
  100k on an H100's 132 SMs 8 splits at 256 rows, 33 at 64), the conv and the recurrences
  one call a bucket (`row_groups`; the graphs keyed by the buckets' split counts together);
- grid chunks of several sessions (item 2): B chunks of the grid's rows, each at its own
  position of one FA4 split count over pages of its own, their GDN states returned, run the
  way chunk_way gives (Runners.chunk_batch, the graph adapter's read_chunks; it falls back
  along CHUNK_WAYS).

Which ops run over all B * t rows and which per fork, and why (evals/bi_bench.py `graphs`,
docs/bi-bench-graphs-q64-h100-2026-12-05.log, one H100; the profile of four 64-row questions
at 100k, docs/bi-bench-questions-h100-2026-12-06-f.log: FA4 took 42 % of the device time,
what grows with the forks beside it mostly their splits' copies and combine, the GDN conv and
gates, and the norms):
- over all rows: the embedding (a gather), the RMSNorms and residual adds (with `norms`:
  the question runners' and, with Runners' row_invariant, the chunk runner's are
  model.rowwise's row-invariant kernels; the compiled ones run one call a fork), every
  projection but the MLP's down projection (cuBLAS over the fused weights, model.fuse; o_proj
  and the GDN out_proj), the attention's output gate and the MLP's SwiGLU (compiled
  elementwise ops): each 64- and 128-row block of a 2-8 block GEMM or norm kept the bits
  it has alone there;
- per fork, on the same rows and strides as the question's own runner: the KV rows' write
  and FA4's split and tail tables (built from its own staged page table: the same tables as
  alone), and the down projection where the op set's is cuBLAS (it picked another kernel
  for 64-row blocks of a batch, split-K for 64 rows alone; as one batched GEMM too, question_bench
  `down_bmm`): the question runners on CUDA run model.invariant's split-K kernel instead
  (ops.row_invariant_ops), over all rows with `rows`; a batch of grid chunks runs cuBLAS's
  over all rows with `down` (512-row blocks kept their bits on an H100; the check decides);
- in one call for all forks (OneCall), where that keeps each fork's bits: FA4 over every
  fork's rows through fork 0's split tables (a batch of S, q broadcast: the forks share
  their context rows below the splits' end, `shares`), over their tails (a batch of B) and
  one combine (fa4_graph.attend_many; FA4's programs each compute one batch element's
  tile, the splits' rows each as alone: no mask); the GDN
  recurrences from their own states over [B, t] rows (fla's chunked kernels run a program
  per sequence and head); the GDN conv from their own conv states over [B, t] rows (fla's
  conv; question_bench `row_ops`: every fork kept its bits on an H100); the q/k heads (norms,
  RoPE: the forks share one position), the GDN gates and the gated norm over all rows
  (`rows`: torch.compile's kernels gave some forks other bits over all rows on an H100 and
  an H200, question_bench `row_ops` and bi_bench `graphs` and `chunks`; the question runners
  below the grid, and the chunk runner with Runners' row_invariant (the default on CUDA), run
  model.rowwise's row-invariant kernels instead: its norm_rope, gdn_gates and gated norm kept
  every fork's and chunk's bits on an H100), and the down projection; else one call a fork
  (`fall_back`). The splits as a batch of S * B over copies of q, one fork's splits a batch
  element, took 1.78 ms at 100k for four 64-row forks on an H100 against 1.63 ms for these,
  each kept every fork's bits (evals/question_bench.py `q_copies`,
  docs/bi-bench-questions-h100-2026-12-06-h.log); a build of the shared splits that copied
  q ran no faster as a whole forward on an H200 (7.01 against 6.94 ms, 2026-12-06); with q
  broadcast four such questions took 4.88 ms in one forward, 1.68x one
  (docs/bi-bench-questions-h100-2026-12-06-i.log).
Whether the ops over all rows keep each fork's bits depends on the device, the libraries and
the row count (cuBLAS and torch.compile pick kernels by shape), so nothing here assumes it: the
graph adapter compares the first batch of each (B, t) with the same forks run alone, bit for
bit; where they differ it tries every part one call a fork (PER_FORK: where that differs too,
every way does, and it runs that shape one fork at a time from then on,
adapters.graphed.GraphAdapter.fork_logits_batch), then the ways after the first in
OneCall.fallback's order until one keeps the bits.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, fields, replace

import torch

from adapters.attention import fa4, fa4_plan
from adapters.model.config import FULL
from adapters.model.layers import rope_cos_sin
from adapters.runners import capture
from adapters.runners.meta import MAX_TABLE_PAGES, ChunkMeta
from adapters.runners.slots import SlotGroup, stacked


@dataclass(frozen=True)
class OneCall:
    """Which of a batch's per-fork parts run as one call for all its forks:
    - attention: FA4 in one call for all forks (fa4_graph.attend_many: every fork's rows
      through fork 0's splits in one call, their tails in one, one combine; FA4 only; the
      forks must share their rows below the splits' end, `shares`);
    - recurrences: the GDN recurrences over [B, t] rows (KernelSet.recurrences);
    - conv: the GDN conv over [B, t] rows from each fork's conv state (KernelSet.convs);
    - rows: the row-wise ops between the projections over all B * t rows through the
      runner's op set (row-invariant kernels in the question runners on CUDA, ops.
      row_invariant_ops): the q/k heads (norms, RoPE), with conv the GDN gates
      (GatedDeltaNet.gates_many), with recurrences the gated norm, and the MLP's down
      projection where the op set has a row-invariant one (Ops.down);
    - norms: the layers' RMSNorms, each joined to the residual add before it, over all
      B * t rows (model.rowwise's row-invariant kernels in the question runners on CUDA and
      in the chunk runner with Runners' row_invariant; the compiled norms gave other bits at
      512-row blocks on an H100, docs/bi-bench-graphs-h100-2026-12-05.log), else one call a
      fork;
    - down: the MLP's down projection over all B * t rows through the op set's linear
      (cuBLAS) where it has no row-invariant one (with `rows` and one it runs over all rows
      anyway): cuBLAS picks its kernel by the row count, and kept each 512-row block's bits
      in a batch on an H100 (bi_bench `graphs`) but gave 64-row blocks other bits, so the
      grid chunks' ways only (CHUNK_WAYS); off by default. Over all rows it ran four chunks'
      down projections in 24 calls of 18 us where one call a chunk took 96 of 10.6 us
      (docs/bi-bench-chunks-profile-h100-2026-12-06.log, eagerly)."""

    attention: bool = True
    recurrences: bool = True
    conv: bool = True
    rows: bool = True
    norms: bool = True
    down: bool = False

    @property
    def parts(self) -> tuple[str, ...]:
        """The names of the parts in one call, in field order."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name))

    @property
    def name(self) -> str:
        """The parts in one call joined by '+' (evals.question_bench's arms), or 'per_fork'
        for none."""
        return "+".join(self.parts) or "per_fork"

    def fallback(self, fa4: bool = True) -> OneCall | None:
        """The next way a question batch tries where this one gave a fork other bits than
        alone (BatchRunner.fall_back; a batch of grid chunks follows CHUNK_WAYS instead, the
        graph adapter's check): the next of WAYS (for a way not among them, the first of WAYS
        whose parts are a strict subset of its own; from there on WAYS' order, which may turn
        a part on again that a way before had off: the check's order, not a narrowing),
        skipping those with FA4 in one call where fa4 is False (SDPA on the CPU); None after
        the last."""
        later = WAYS[WAYS.index(self) + 1:] if self in WAYS else [
            w for w in WAYS if set(w.parts) < set(self.parts)]
        return next((w for w in later if fa4 or not w.attention), None)


ALL_IN_ONE = OneCall()
PER_FORK = OneCall(attention=False, recurrences=False, conv=False, rows=False, norms=False)
# a batch of grid chunks of several sessions: no rows shared, so FA4 one call a fork; the
# chunk runner's compiled norms one call a fork (they gave other bits over more rows on an
# H100, docs/bi-bench-graphs-h100-2026-12-05.log); its row-wise ops and conv one call a fork
CHUNKS = OneCall(attention=False, conv=False, rows=False, norms=False)
# the chunk batches' ways in the check's order (Runners.chunk_batch starts at chunk_way's,
# GraphAdapter._checked_chunks falls back; falling back from the first, the check passes the
# compiled ops' start, which turns `down` on again):
# every part but FA4 in one call with the down projection over all rows (the norms and
# row-wise ops over all rows keep each chunk's bits through model.rowwise's kernels,
# ops.rowwise_chunk_ops), then the down projection one call a chunk, then the norms too, then
# the row-wise ops too (q/k heads, GDN gates, gated norm: through the compiled ops four
# chunks' rows gave other bits over all rows on an H100,
# docs/bi-bench-chunks-profile-h100-2026-12-06.log) with and without the down projection,
# then the conv too (CHUNKS), then every part one call a chunk
CHUNK_WAYS = (OneCall(attention=False, down=True),
              OneCall(attention=False),
              OneCall(attention=False, norms=False),
              OneCall(attention=False, rows=False, norms=False, down=True),
              OneCall(attention=False, rows=False, norms=False),
              CHUNKS,
              PER_FORK)


def chunk_way(row_invariant: bool) -> OneCall:
    """The way a batch of grid chunks starts (Runners.chunk_batch): with the chunk runner's
    row-wise reductions row-invariant (Runners' row_invariant) every part but FA4 in one call,
    CHUNK_WAYS[0]; else the norms and row-wise ops one call a chunk, CHUNK_WAYS[3] (the
    compiled ones gave other bits over all rows on an H100, bi_bench `graphs` and `chunks`)."""
    return CHUNK_WAYS[0] if row_invariant else CHUNK_WAYS[3]


# the question batches' ways in the check's order: the norms, then the row-wise ops first
# (through torch.compile's kernels, which pick their kernels by row count, the norms gave
# other bits over 512-row blocks on an H100, bi_bench `graphs`, and the row-wise ops over all
# rows gave some forks other bits on an H100 and an H200, question_bench `row_ops`,
# 2026-12-06; the question runners on CUDA run model.rowwise's instead, the norms too where
# the chunk runner's are row-invariant, Runners.question_ops), then FA4, the recurrences and
# the conv in one call (each kept its bits there)
WAYS = (ALL_IN_ONE,
        OneCall(norms=False),
        OneCall(rows=False),
        OneCall(conv=False, rows=False),
        OneCall(attention=False),
        OneCall(attention=False, rows=False),
        OneCall(attention=False, conv=False, rows=False),
        OneCall(recurrences=False, conv=False, rows=False),
        PER_FORK)


def shape_name(key: tuple) -> str:
    """A batch's shape (BatchRunner.key) as status names it: "BxT" for B forks of T rows, or a
    mixed batch's rows joined by "+" ("256+64+64")."""
    b, t = key
    return f"{b}x{t}" if isinstance(t, int) else "+".join(map(str, t))


@dataclass(frozen=True)
class RowGroup:
    """A batch's forks of one row count, next to each other: forks first .. first + num - 1,
    t rows each, through `runner` (a question runner of that bucket, or the chunk runner)."""

    runner: object
    first: int
    num: int

    @property
    def t(self) -> int:
        return self.runner.t

    @property
    def forks(self) -> range:
        return range(self.first, self.first + self.num)


def _same(a, b) -> bool:
    """Whether two runners' parts are one: the same object, or equal plain values (ints,
    strings, flags); objects holding tensors (fused projections) only by identity, since
    `==` on them raises."""
    plain = (bool, int, float, str, type(None))
    return a is b or (isinstance(a, plain) and isinstance(b, plain) and a == b)


def _same_op(a, b) -> bool:
    """Whether two ops of an op set compute alike: the same function, or partials of one
    function with the same arguments (ops.row_invariant_ops makes its `down` anew a call)."""
    if a is b:
        return True
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func is b.func and a.args == b.args and a.keywords == b.keywords
    return False


def row_groups(runners: list) -> tuple[RowGroup, ...]:
    """The forks' runners (one a fork) as groups of one runner each, in fork order. Raises
    ValueError where one runner's forks are not next to each other, two runners have one row
    count, or the runners differ in what a batch runs once for all of them (model, attention,
    graphs, page rows, fused projections, op set)."""
    groups: list[list] = []
    for b, runner in enumerate(runners):
        if groups and groups[-1][0] is runner:
            groups[-1][2] += 1
            continue
        if any(g[0].t == runner.t for g in groups):
            why = "another runner of that row count" if groups[-1][0].t == runner.t else \
                "not next to the others"
            raise ValueError(f"a batch's forks of {runner.t} rows run through one runner, "
                             f"next to each other; fork {b}'s is {why}")
        first = runners[0]
        unlike = [name for name in ("model", "attention", "use_graphs", "page_rows", "proj")
                  if not _same(getattr(runner, name), getattr(first, name))]
        unlike += [f"ops.{f.name}" for f in fields(first.ops)
                   if not _same_op(getattr(runner.ops, f.name), getattr(first.ops, f.name))]
        if unlike:
            raise ValueError(f"a batch's runners share what runs once for all forks; fork "
                             f"{b}'s runner ({runner.t} rows) differs in {', '.join(unlike)}")
        groups.append([runner, b, 1])
    return tuple(RowGroup(r, first, num) for r, first, num in groups)


class BatchRunner:
    """B forwards ("forks") of exactly t rows each (a mixed batch: each its runner's rows) over
    one KV pool: questions at one position, or grid chunks at positions of one FA4 split
    count.

    Args: runner: the runner of t rows whose bits each fork must get (a runners.graphs.
    ChunkGraphs made by runners.Runners: a question runner, or the grid's chunk runner; its
    model, compiled op set, fused projections, attention, page size and side stream are this
    batch's, so the ops it runs per fork are its own), or a list of runners, one a fork, for
    questions of several buckets in one forward (a "mixed" batch, one_position only: the forks
    of one runner next to each other, `row_groups`; the runners alike but for their row count):
    the ops over all rows run once over every fork's rows, the attention (each bucket has its
    own FA4 split count), the conv and the recurrences one call a group (`calls` as for one
    runner, a group of one fork its own runner's calls); slots: B >= 2 runners.slots.StateSlots,
    the forks' input GDN states (static inputs of the graphs; Runners shares one set between its
    batches: each run feeds them first), which return the forks' new states (`read`) or none
    (questions), all alike; calls: which per-fork parts run as one call for all forks (OneCall;
    its attention is off without FA4, its conv with the op set's fused conv and gates;
    `fall_back` takes the next way); one_position: the forks share one position (one RoPE for
    all), else each its own of one FA4 split count.
    Raises ValueError for B < 2, runners that `row_groups` refuses, or a runner whose attention
    is neither FA4 over its device-built tables (runners.fa4_graph: inside one graph per split
    count on CUDA, eagerly elsewhere, as with tests/fake_fa4.py) nor SDPA without graphs (the
    CPU): the table attention is not batched.

    Static buffers (the model's device): per fork its ChunkMeta (ids, pos, pools' places, page
    table) and, with FA4, its split and tail tables per split count and each group's copy of
    the tails (fa4_graph.BatchTables: up to 4.3 MB a fork at 64 rows on a grid of 512 over
    every split count on an H100), the hidden rows [B * t, hidden] and per full-attention
    layer its attention output [B * t, H * D] (a mixed batch: the sum of its forks' rows for
    B * t; 12 MiB in all at 4 x 128 rows on the 0.8B); its graphs' memory pool holds one
    forward's working set, and with slots that return states each graph keeps its forks'
    output states (19.8 MB a fork on the 0.8B: about 160 MB a graph at B = 8, a graph per
    split count, or tuple of a mixed batch's groups' split counts, and pool)."""

    def __init__(self, runner, slots: list, calls: OneCall = ALL_IN_ONE,
                 one_position: bool = True):
        num_seqs = len(slots)
        if num_seqs < 2:
            raise ValueError(f"a batch holds 2 or more forks, got {num_seqs}")
        runners = list(runner) if isinstance(runner, (list, tuple)) else [runner] * num_seqs
        if len(runners) != num_seqs:
            raise ValueError(f"a runner a fork: {len(runners)} runners for {num_seqs} forks")
        self.row_groups = row_groups(runners)
        if len(self.row_groups) > 1 and not one_position:
            raise ValueError("forks of several row counts share one position (questions)")
        runner = runners[0]
        on_fa4 = runner.attention == "fa4" and runner.split_graphs is not None
        if not (on_fa4 or (runner.attention == "sdpa" and not runner.use_graphs)):
            raise ValueError(f"forwards are batched with FA4 inside the graph (CUDA) or SDPA "
                             f"(the CPU), not attention {runner.attention!r}")
        model = runner.model
        cfg, dev, dt = model.cfg, model.device, model.dtype
        # ts: each fork's rows; t: theirs when all have one count (else None); offsets: fork
        # b's rows in the batch's buffers are [offsets[b], offsets[b + 1])
        self.ts = tuple(r.t for r in runners)
        self.t = self.ts[0] if len(self.row_groups) == 1 else None
        self.offsets = tuple(itertools.accumulate(self.ts, initial=0))
        self._group_of = [(gi, k) for gi, g in enumerate(self.row_groups)
                          for k in range(g.num)]       # fork b: (its group, its place there)
        self.model, self.num_seqs = model, num_seqs
        self.ops, self.proj, self.page_rows = runner.ops, runner.proj, runner.page_rows
        self.attention, self.use_graphs = runner.attention, runner.use_graphs
        self.side_stream = runner.side_stream          # capture.side_stream reads it
        self.full_index = {i: j for j, i in enumerate(
            i for i, x in enumerate(model.layers) if x.layer_type == FULL)}
        self.gdn_index = {i: g for g, i in enumerate(cfg.linear_layers)}
        num_full = len(self.full_index)
        self.metas = [ChunkMeta(t, num_full, self.page_rows, dev, dt, None, sub_pages=on_fa4)
                      for t in self.ts]
        self.slots = list(slots)
        self.group = SlotGroup(self.slots)             # what a graph keeps of their outputs
        self.one_position = one_position
        self.calls = self._runnable(calls, on_fa4)
        self.steps = torch.arange(max(self.ts), device=dev)
        rows = self.offsets[-1]
        self.hidden = torch.zeros(rows, cfg.hidden_size, device=dev, dtype=dt)
        self.attn_out = [torch.zeros(rows, cfg.num_attention_heads * cfg.head_dim, device=dev,
                                     dtype=dt) for _ in range(num_full)]
        self._fa4 = self.split_graphs = None
        if on_fa4:
            from adapters.runners import fa4_graph
            self._fa4 = fa4.FA4Attention(cfg.num_attention_heads, cfg.num_key_value_heads)
            self.split_graphs = fa4_graph.SplitGraphs(max(self.ts),
                                                      MAX_TABLE_PAGES * self.page_rows, dev)
        self._tables_by_s: dict = {}                   # (group, S) -> fa4_graph.BatchTables
        self._tables = None                            # the staged batch's, one a group
        self._kvs: list | None = None                  # the staged forks' PagedKv
        self._prepared = False

    @property
    def key(self) -> tuple:
        """The batch's shape: (B, t) with one row count, else (B, ts) (the graph adapter's
        batch_bits key)."""
        return (self.num_seqs, self.t if self.t is not None else self.ts)

    def rows(self, b: int) -> slice:
        """Fork b's rows in the batch's buffers."""
        return slice(self.offsets[b], self.offsets[b + 1])

    def group_rows(self, g: RowGroup) -> slice:
        """A group's rows in the batch's buffers (its forks', one after another)."""
        return slice(self.offsets[g.first], self.offsets[g.first + g.num])

    # -- the body ---------------------------------------------------------------------------

    def _body(self) -> None:
        """The forward of every fork: Qwen35.forward's ops in the runner's order (as
        ChunkGraphs' segments run them), those over all rows once, the others per fork."""
        m, cfg = self.model, self.model.cfg
        if self._tables is not None:                   # FA4's tables of every fork
            for g, tables in zip(self.row_groups, self._tables):
                for b, fork_tables in zip(g.forks, tables.forks):
                    meta = self.metas[b]
                    fork_tables.fill(meta.meta, g.t, meta.table_at, self.page_rows)
                if self.calls.attention and g.num > 1:     # as attend_many takes them
                    tables.gather()
        x = m.embed_tokens(torch.cat([meta.meta[:t] for meta, t in zip(self.metas, self.ts)]))
        # each fork's cos, sin [t, rotary_dim] (at one position, one pair a group's forks),
        # and with calls.rows all rows' [sum of t, rotary_dim]
        ropes = []
        for g in self.row_groups:
            at = [g.first] if self.one_position else list(g.forks)
            ropes += [rope_cos_sin(self.steps[:g.t] + self.metas[b].meta[g.t], cfg.rotary_dim,
                                   cfg.rope_theta, x.dtype) for b in at] * (g.num // len(at))
        rope = tuple(torch.cat(c) for c in zip(*ropes)) if self.calls.rows else ropes
        eps = cfg.rms_norm_eps
        h = self._norm(None, x, m.layers[0].input_layernorm.weight, eps)
        for i, layer in enumerate(m.layers):
            if layer.layer_type == FULL:
                h = self._attention(i, layer.self_attn, h, rope)
            else:
                h = self._gdn(i, layer.linear_attn, h)
            x, h = self._norm(x, h, layer.post_attention_layernorm.weight, eps)
            h = self._mlp(i, layer.mlp, h)
            if i + 1 < len(m.layers):
                x, h = self._norm(x, h, m.layers[i + 1].input_layernorm.weight, eps)
        self.hidden.copy_(x + h)

    def _norm(self, x, h: torch.Tensor, weight: torch.Tensor, eps: float):
        """op.rms_norm of h [B * t, hidden] (x None), else op.add_rms_norm of x + h (returns
        (x + h, its norm)): over all rows with calls.norms, else one call a fork."""
        op = self.ops
        if self.calls.norms:
            return op.rms_norm(h, weight, eps) if x is None else op.add_rms_norm(x, h, weight,
                                                                                 eps)
        rows = [self.rows(b) for b in range(self.num_seqs)]
        if x is None:
            return torch.cat([op.rms_norm(h[r], weight, eps) for r in rows])
        outs = [op.add_rms_norm(x[r], h[r], weight, eps) for r in rows]
        return torch.cat([a for a, _ in outs]), torch.cat([b for _, b in outs])

    def _attention(self, i: int, attn, h: torch.Tensor, rope) -> torch.Tensor:
        """Full-attention layer i on h [B * t, hidden]: the projections over all rows, the
        heads (q/k norms, RoPE: over all rows with calls.rows, rope then cos, sin [B * t,
        rotary_dim], else per fork, rope[b] fork b's [t, rotary_dim]), per fork its KV rows,
        the attention into attn_out (one call for all forks with calls.attention, else per
        fork into its rows), then the output gate and o_proj over all rows. Returns
        [B * t, hidden]."""
        op, j, n = self.ops, self.full_index[i], self.num_seqs
        cfg = self.model.cfg
        qg, k, v = attn.project_rows(h, op, self.proj and self.proj.attn_in[i])
        out, rows = self.attn_out[j], [self.rows(b) for b in range(n)]
        if self.calls.rows:
            q, k, v, _ = attn.heads(qg, k, v, rope, op)
            heads = [(q[r], k[r], v[r]) for r in rows]
        else:
            heads = [attn.heads(qg[r], k[r], v[r], rope[b], op)[:3]
                     for b, r in enumerate(rows)]
        if self.calls.attention:                       # one call a group (a fork's own alone)
            from adapters.runners import fa4_graph
            for b, (_, k_b, v_b) in enumerate(heads):
                self._write_kv(b, j, k_b, v_b)
            q = q if self.calls.rows else torch.cat([q_b for q_b, _, _ in heads])
            pools = self._kvs[0].pool.layer(j)
            for g, tables in zip(self.row_groups, self._tables):
                r = self.group_rows(g)
                if g.num > 1:
                    fa4_graph.attend_many(fa4.forward(), q[r], *pools, tables, out[r],
                                          self._split_stream(q))
                else:
                    fa4_graph.attend(fa4.forward(), q[r], *pools, tables.forks[0], out[r],
                                     self._split_stream(q))
        else:
            for b, (q_b, k_b, v_b) in enumerate(heads):
                self._attend(b, j, attn, q_b, k_b, v_b, out[rows[b]])
        gate = qg.view(qg.shape[0], cfg.num_attention_heads, 2 * cfg.head_dim)[..., cfg.head_dim:]
        return attn.output(out, gate, op)

    def _attend(self, b: int, j: int, attn, q, k, v, out: torch.Tensor) -> None:
        """Fork b's attention of full-attention layer j: its KV rows written and q [t, H, D]
        attended over its pages into out [t, H * D] (a contiguous row block), as its own
        runner does (FA4 over its tables, or SDPA through its pages on the CPU)."""
        meta, pool = self.metas[b], self._kvs[b].pool
        if self._tables is not None:
            from adapters.runners import fa4_graph
            self._write_kv(b, j, k, v)
            gi, place = self._group_of[b]
            fa4_graph.attend(fa4.forward(), q, *pool.layer(j), self._tables[gi].forks[place],
                             out, self._split_stream(q))
            return
        from adapters.attention.paged import LayerPages
        pages = LayerPages(*pool.layer(j), meta.table(meta.num_pages))
        out.copy_(attn.attend(q, k, v, meta.staged_pos, pages))

    def _write_kv(self, b: int, j: int, k, v) -> None:
        """Fork b's KV rows k, v [t, Hkv, D] of full-attention layer j into its pages (FA4's
        path, as its runner writes them)."""
        from adapters.attention import table
        meta = self.metas[b]
        table.write_kv(table.kv_rows(k), table.kv_rows(v), meta.pool_base, meta.places(j),
                       meta.pos, meta.table(), self.page_rows)

    def _split_stream(self, q: torch.Tensor):
        """The side stream FA4's splits run on (as the runner's), or None."""
        return self._fa4.split_stream(q.device) if self._fa4.overlap and q.is_cuda else None

    def _gdn(self, i: int, gdn, h: torch.Tensor) -> torch.Tensor:
        """GDN layer i on h [B * t, hidden]: the input projections over all rows; the conv from
        each fork's conv state (one call with calls.conv, GatedDeltaNet.gates_many) and
        the gates (over all rows with calls.rows, else per fork), or without calls.conv
        GatedDeltaNet.gates per fork; the recurrences from each fork's state
        (KernelSet.recurrences: one call over [B, t] rows with calls.recurrences, else
        KernelSet.gdn per fork), a group at a time (`_gdn_group`); the gated norm (over
        all rows with calls.rows where every group's o is one tensor or one fork's: with
        calls.recurrences, or groups of one fork; else per fork); out_proj over all
        rows. Returns [B * t, hidden]; with slots that return states, each fork's new
        conv and recurrent states go to `group` (SlotGroup.set), else they are not kept."""
        op, g, n = self.ops, self.gdn_index[i], self.num_seqs
        qkv, z, b_, a = gdn.project(h, op, self.proj and self.proj.gdn_in[i])
        convs = [slots.inputs[g][0] for slots in self.slots]       # [conv_dim, W] each
        states = [slots.inputs[g][1] for slots in self.slots]      # [HV, K, V] fp32 each
        new_convs, new_states, os = [None] * n, [None] * n, []
        for group in self.row_groups:        # o: [n, t, HV, V] or a [t, HV, V] a fork
            o, group_convs, group_states = self._gdn_group(group, gdn, qkv, b_, a, convs,
                                                           states)
            os.append(o)
            for b, conv, state in zip(group.forks, group_convs, group_states):
                new_convs[b], new_states[b] = conv, state
        if self.group.returned:               # each fork's states after its t rows
            for b in range(n):
                self.group.set(b, g, new_convs[b], new_states[b])
        if self.calls.rows and all(torch.is_tensor(o) or len(o) == 1 for o in os):
            # over all rows: the groups' o [sum of t, HV, V] (a copy with several groups)
            flat = [o.reshape(-1, *o.shape[2:]) if torch.is_tensor(o) else o[0] for o in os]
            normed = gdn.gated_norm(flat[0] if len(flat) == 1 else torch.cat(flat), z, op)
        else:
            per_fork = [o[k] for o in os for k in range(len(o))]
            normed = torch.cat([gdn.gated_norm(o_b, z[self.rows(b)], op)
                                for b, o_b in enumerate(per_fork)])
        return op.linear(normed, gdn.out_proj.weight)

    def _gdn_group(self, group: RowGroup, gdn, qkv, b_, a, convs: list, states: list):
        """One group's conv, gates and recurrences (see _gdn): with calls.conv the conv and
        gates in one call over its [num, t] rows (GatedDeltaNet.gates_many), else a call a
        fork; with calls.recurrences the recurrences in one (KernelSet.recurrences), else
        KernelSet.gdn a fork; a group of one fork its runner's calls. Returns (o: [num, t, HV,
        V], or a list of [t, HV, V] a fork; the forks' new conv states; their new recurrent
        states)."""
        op, kernels = self.ops, self.model.kernels
        n, t, forks = group.num, group.t, group.forks
        held = slice(group.first, group.first + n)
        if self.calls.conv and n > 1:       # q, k, v, g, beta: [n, t, ...] tensors
            r = self.group_rows(group)
            *gates, new_convs = gdn.gates_many(qkv[r].view(n, t, -1), b_[r].view(n, t, -1),
                                               a[r].view(n, t, -1), stacked(convs[held]),
                                               kernels, op, self.calls.rows)
        else:                                 # q, k, v, g, beta: n tensors each
            outs = [gdn.gates(qkv[r], b_[r], a[r], convs[b], kernels, op)
                    for b, r in zip(forks, map(self.rows, forks))]
            gates, new_convs = list(zip(*(x[:5] for x in outs))), [x[5] for x in outs]
        if self.calls.recurrences and n > 1:
            o, new_states = kernels.recurrences(*(x if torch.is_tensor(x) else torch.stack(x)
                                                  for x in gates), stacked(states[held]))
            return o, new_convs, new_states
        outs = [kernels.gdn(*(x[k] for x in gates), states[b]) for k, b in enumerate(forks)]
        return [x[0] for x in outs], new_convs, [x[1] for x in outs]

    def _mlp(self, i: int, mlp, h: torch.Tensor) -> torch.Tensor:
        """Layer i's MLP on h [B * t, hidden]: gate and up projections and SwiGLU over all rows,
        the down projection over all rows with calls.down, or with calls.rows where the op
        set's is row-invariant (Ops.down), else per fork. Returns [B * t, hidden]."""
        op, w = self.ops, mlp.down_proj.weight
        g, u = mlp.gate_up(h, op, self.proj and self.proj.mlp_in[i])
        act = op.swiglu(g, u)
        if self.calls.down or (self.calls.rows and op.down is not None):
            return op.down_proj(act, w)
        return torch.cat([op.down_proj(act[self.rows(b)], w) for b in range(self.num_seqs)])

    # -- warm-up, staging, running ----------------------------------------------------------

    def prepare(self) -> None:
        """On CUDA, the body run eagerly twice at one position of each number of splits it can
        meet (FA4 and torch.compile compile, cuBLAS makes its handles) over KV rows of its own,
        on the runners' side stream (capture.side_stream); its graphs are captured over the
        reader's pool by `capture_over`, over another pool at its first batch of each split
        count (fa4_graph.SplitGraphs). Nothing on the CPU."""
        if self._prepared or not self.use_graphs:
            return
        from adapters.model.config import spec_for
        from block_store import contiguous_kv
        cfg, dev, dt = self.model.cfg, self.model.device, self.model.dtype
        positions = list(self._graph_keys().values())          # every key's (read now)
        kv = contiguous_kv(spec_for(cfg, dev, dt), self.page_rows,
                           positions[-1] + max(self.ts))
        kv.pool.block.zero_()
        try:
            for pos in positions:
                self._stage([([0] * t, pos, kv) for t in self.ts])
                capture.twice_on_side(self, self._body)
        finally:
            self._kvs = self._tables = None            # the warm-up's rows go with kv
        self._prepared = True

    def capture_over(self, pool) -> None:
        """With FA4 in the graph: the graph of every split count over `pool` (a block_store
        KvPool, the reader's) captured now, as runners.capture.capture_splits does for a
        runner, so that no batch over it captures one (a sync) later, and that pool pinned
        (its graphs kept whatever other pools come); after `prepare`."""
        from block_store import PagedKv
        if self.split_graphs is None or not self.use_graphs:
            return
        self.split_graphs.pin(pool)                    # kept whatever other pools come
        for key, pos in self._graph_keys().items():
            self._tables = self._tables_at(pos)
            self._kvs = [PagedKv(pool, [])] * self.num_seqs
            try:
                self.split_graphs.ensure(key, pool, self._body, self.group)
            finally:
                self._kvs = self._tables = None

    def fall_back(self) -> bool:
        """Take the next way of OneCall.fallback (where this one gave a fork other bits than
        alone: the graph adapter's check); the graphs captured the old way are dropped (the
        reader's pool's too: GraphAdapter.prepare checks before capture_over, so on CUDA none
        are there yet) and the next run warms up again (eagerly, then captures: a sync).
        False when every part already runs one call a fork."""
        calls = self.calls.fallback(self._fa4 is not None)
        if calls is None:
            return False
        self.use(calls)
        return True

    def use(self, calls: OneCall) -> None:
        """Run the way `calls` from now on (its attention off without FA4, its conv with the
        fused conv and gates, as the constructor sets them); the graphs captured another way
        are dropped and the next run warms up again, as `fall_back`."""
        calls = self._runnable(calls, self._fa4 is not None)
        if calls == self.calls:
            return
        self.calls = calls
        if self.split_graphs is not None:
            self.split_graphs.drop()
        self._prepared = False

    def _runnable(self, calls: OneCall, fa4: bool) -> OneCall:
        """`calls` as this batch can run it: its attention off without FA4 or at positions of
        their own (forks at two positions read other split tables: one_position False), its
        conv off with the op set's fused conv and gates (ops.conv_gates: one sequence a
        call)."""
        if not fa4 or not self.one_position:
            calls = replace(calls, attention=False)
        if self.ops.conv_gates is not None:
            calls = replace(calls, conv=False)
        return calls

    def _tables_at(self, pos: int) -> list:
        """Each group's fa4_graph.BatchTables of its split count at pos (made at the first
        ask)."""
        from adapters.runners import fa4_graph
        out = []
        for gi, g in enumerate(self.row_groups):
            s = self._fa4.num_splits(pos, g.t, self.model.device)
            if (gi, s) not in self._tables_by_s:
                self._tables_by_s[(gi, s)] = fa4_graph.BatchTables(
                    s, g.t, self.split_graphs.max_rows, self.model.device, g.num)
            out.append(self._tables_by_s[(gi, s)])
        return out

    def _graph_keys(self) -> dict:
        """{graph key (`splits`): the first position of MIN_SPLIT_KEYS' multiples that has
        it}: every key a batch can meet, in order of position (each group's split count grows
        with pos // MIN_SPLIT_KEYS up to its most, fa4_plan.split_plan)."""
        dev = self.model.device
        most = max(max(self._fa4.all_splits(g.t, dev)) for g in self.row_groups)
        keys: dict = {}
        for m in range(most + 2):
            keys.setdefault(self.splits(m * fa4_plan.MIN_SPLIT_KEYS), m * fa4_plan.MIN_SPLIT_KEYS)
        return keys

    def _stage(self, items) -> None:
        """Each fork's ids, pos, pools' places and page table into its meta (ChunkMeta.stage),
        and with FA4 each group's SplitTables of its split count."""
        for meta, (ids, pos, kv) in zip(self.metas, items):
            meta.stage(ids, pos, kv)
        self._kvs = [kv for _, _, kv in items]
        if self._fa4 is not None:
            self._tables = self._tables_at(items[0][1])

    def shares(self, pos: int, shared_rows: int) -> bool:
        """Whether forks at pos that hold the same KV rows [0, shared_rows) can run as one
        batch the way it runs now: always, unless FA4 in one call (calls.attention) would read
        rows [0, S Ls) past shared_rows through a group's first fork's pages
        (fa4_graph.attend_many; a group of one fork reads its own, fa4_graph.attend)."""
        if self._fa4 is None or not self.calls.attention:
            return True
        return self._split_keys(pos) <= shared_rows

    def _split_keys(self, pos: int) -> int:
        """The most keys any group of several forks has its splits read at pos through its
        first fork's pages (rows [0, S Ls)); 0 for none."""
        return max((self._fa4.split_keys(pos, g.t, self.model.device)
                    for g in self.row_groups if g.num > 1), default=0)

    def splits(self, pos: int):
        """FA4's split count S of a fork at pos (its graph's key: a batch's forks share one);
        with several groups the tuple of theirs; 0 without FA4."""
        if not self._fa4:
            return 0
        counts = tuple(self._fa4.num_splits(pos, g.t, self.model.device)
                       for g in self.row_groups)
        return counts[0] if len(counts) == 1 else counts

    @torch.no_grad()
    def run(self, items, shared_rows: int = 0) -> list[torch.Tensor]:
        """The forks' forwards: items, one per fork, (ids: t ints or a [t] int64 tensor, pos,
        kv: its block_store.PagedKv holding rows >= pos + t, gdn: its states as
        Qwen35.forward takes them), all at one pos (a batch made with one_position=False: at
        positions of one split count, `splits`) over one pool, no two writing one page.
        shared_rows: the forks hold the same KV rows [0, shared_rows) (the caller's word:
        forks of one session's state, their pages there the same or copies of one page; the
        pages wholly below it are checked to be the same), which FA4 in one call reads once
        for all forks (`shares`). Writes each fork's KV rows [pos, pos + t); returns each
        fork's hidden rows [t, hidden] (new tensors; the states are not changed).

        Raises ValueError for another number of items, ids of another length, forks at other
        positions (or split counts) or over other pools, pages that cannot take the rows (as
        ChunkGraphs.run checks them), other pages below shared_rows, or forks that share too
        few rows (`shares`), before anything runs."""
        items = [(list(ids) if isinstance(ids, tuple) else ids, pos, kv, gdn)
                 for ids, pos, kv, gdn in items]
        if len(items) != self.num_seqs:
            raise ValueError(f"a batch of {self.num_seqs} forks, got {len(items)}")
        pos, pool = items[0][1], items[0][2].pool
        for (ids, p, kv, _), t in zip(items, self.ts):
            n = len(ids) if isinstance(ids, list) else int(ids.shape[0])
            placed = p == pos if self.one_position else \
                p >= 0 and self.splits(p) == self.splits(pos)
            if n != t or not placed or kv.pool is not pool:
                where = "at one position" if self.one_position else \
                    f"at positions of one FA4 split count ({self.splits(pos)} at {pos})"
                each = f"{t} ids each" if self.t is not None else f"{list(self.ts)} ids"
                raise ValueError(f"a batch's forks have {each}, {where}, over one "
                                 f"pool; got {n} ids at {p} (the first at {pos})"
                                 f"{'' if kv.pool is pool else ' over another pool'}")
            if p < 0 or kv.num_rows < p + t or kv.page_rows != self.page_rows or \
                    len(kv.pages) > MAX_TABLE_PAGES:
                raise ValueError(f"{len(kv.pages)} pages of {kv.page_rows} rows cannot take "
                                 f"rows {p} to {p + t} (pages of {self.page_rows} "
                                 f"rows, at most {MAX_TABLE_PAGES} a fork)")
        self._check_shared(items, pos, shared_rows)
        self.prepare()
        self._stage([(ids, p, kv) for ids, p, kv, _ in items])
        for slots, (*_, gdn) in zip(self.slots, items):
            slots.feed(gdn)
        try:
            if self.use_graphs:                        # FA4's graph of the batch's splits
                self.split_graphs.replay(self.splits(pos), pool, self._body, self.group)
            else:
                self._body()
        finally:
            self._kvs = None
        return [self.hidden[self.rows(b)].clone() for b in range(self.num_seqs)]

    def read(self, items) -> list[tuple[torch.Tensor, list]]:
        """`run` for slots that return states (chunks read in a batch: a ChunkGraphs.run
        each): each fork's (hidden [t, hidden], its new gdn list), new tensors. Raises as
        run, and RuntimeError for slots that return none (before anything runs)."""
        if not self.group.returned:
            raise RuntimeError("this batch's state slots return no states (a question batch)")
        hidden = self.run(items)
        return list(zip(hidden, self.group.take()))

    def _check_shared(self, items, pos: int, shared_rows: int) -> None:
        """ValueError unless the forks' pages wholly below shared_rows are the same and they
        share enough rows for the way the batch runs (`shares`)."""
        num_pages = shared_rows // self.page_rows
        first = list(items[0][2].pages[:num_pages])
        for b, (_, _, kv, _) in enumerate(items):
            if len(kv.pages) < num_pages or list(kv.pages[:num_pages]) != first:
                raise ValueError(f"forks sharing rows [0, {shared_rows}) hold the same pages "
                                 f"there; fork {b}'s first {num_pages} differ from fork 0's")
        if not self.shares(pos, shared_rows):
            keys = self._split_keys(pos)
            raise ValueError(f"FA4 in one call reads rows [0, {keys}) of every fork at {pos} "
                             f"through its group's first fork's pages; the forks share "
                             f"{shared_rows}")

    def captures(self) -> dict:
        """num_graphs, num_captures, num_failed_captures, capture_s (as ChunkGraphs.captures);
        all 0 without graphs."""
        if self.split_graphs is None:
            return {"num_graphs": 0, "num_captures": 0, "num_failed_captures": 0,
                    "capture_s": 0.0}
        return self.split_graphs.captures()

