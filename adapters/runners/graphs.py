"""Whole-chunk reads through CUDA graphs: embedding, all layers (GDN and full attention), into
static buffers; replayed for every chunk of every session (runners.runners holds a reader's
runners: grid chunks, questions padded to row buckets (Runners.rows_of), single-token decode).

The body is cut at the full-attention layers into segments (segment j ends with the q/k/v
projection of full-attention layer j; segment j + 1 starts with its output projection).
Attentions:
- "fa4" (the default on Hopper with flash-attn-4 installed): FlashAttention-4 over the pages
  with the keys split by us (attention.fa4; 1.5-2.4x FlashAttention-2 for a 512-id chunk at
  8k-100k on the H200, docs/fa4-probe-2026-11-29.log). By default the whole body is one graph
  per number of splits and KV pool, FA4's tables built inside it from device memory
  (runners.fa4_graph: the host launches one graph a chunk). With fa4_in_graph=False, one graph
  per segment and FA4's calls eager between them (the host knows pos and the pages then);
- "table" (the default on other CUDA GPUs): the whole chunk as one graph, attention by
  attention.table's table-addressed kernel, which reads the position, the pools' places and the
  page table from device memory at replay.
Without graphs (the CPU) the same segments run eagerly with `Attention.attend` (SDPA) unless
`attention="table"` (Triton's interpreter in the tests); with ops.EAGER the segmented body gives
Qwen35.forward's bits (tested).

What varies between chunks reaches the graphs through device memory: the ids, the start
position, the pools' places and the page table sit in one int64 buffer (runners.meta.ChunkMeta),
filled from pinned memory before the first graph; the new KV rows are written inside the graphs
by attention.table.write_kv, which reads pos, the places and the table there; the GDN states are
copied into static inputs (runners.slots: skipped for the states the last run returned, with
keep_states, the reader's chunk runner). The host's time before the first kernel is the GPU's
idle time when chunks are read one at a time (evals/chunk_timeline.py at cadb457,
docs/chunk-timeline-2026-11-29-final.log).

Static buffers (the model's device): meta (runners.meta), per GDN layer the input states (conv
[conv_dim, W] model dtype, recurrent [HV, K, V] fp32), per full layer its attention output
[T, H * D], the final hidden [T, hidden]; for the table attention its split scratch
(attention.table.scratch). The output states are the body's own tensors, which a graph's replay
rewrites in place; `run` copies them out (a question runner's: not at all).
"""
from __future__ import annotations

import torch

from adapters.attention import fa4
from adapters.model import autotune, ops, picks
from adapters.model.config import FULL
from adapters.model.layers import rope_cos_sin
from adapters.runners import capture
from adapters.runners.meta import MAX_TABLE_PAGES, ChunkMeta
from adapters.runners.slots import StateSlots

ATTENTIONS = ("fa4", "table", "sdpa")
# the attentions called eagerly between a chunk's graphs, on the pages as they lie
_BETWEEN = {"fa4": fa4}     # their `available`


def default_attention(device: torch.device, dtype: torch.dtype) -> str:
    """'fa4' where it runs (Hopper, flash-attn-4 installed), else 'table' on CUDA, 'sdpa' on
    the CPU (the path, and so the bits, of a reader built without naming one). torch's
    FlashAttention-2 reads no page table, so it is not one of them."""
    if device.type != "cuda":
        return "sdpa"
    return "fa4" if fa4.available(device, dtype) else "table"


class ChunkGraphs:
    """Runs chunks of exactly `t` ids through `model`; CUDA graphs on CUDA.

    attention: "fa4" (the default on Hopper, `default_attention`), "table" (one graph,
    attention.table; the default on other CUDA GPUs) or "sdpa" (eager only: the default on the
    CPU). fused: the layer's small ops through torch.compile (ops.fused_ops; default on CUDA),
    else ops.EAGER. split: the table attention's tiling (attention.tiling.SplitConfig, default
    attention.tiling.READ; the committed bits depend on it). op_set: the ops to use, overriding
    `fused` (Runners shares one compiled set). proj: model.fuse.FusedProjections (one GEMM for
    the projections that share an input; default: with the fused ops). keep_states:
    runners.slots.StateSlots' keep (bits unchanged). return_states: False for a question runner,
    whose `run` gives back no states (with FA4 in the graph its graphs keep none:
    runners.slots.StateSlots' returned). side_stream: the CUDA stream of its warm-ups (default:
    its own, made at the first; runners.capture.side_stream: runners that share one share
    cuBLAS's workspace). fa4_in_graph: with FA4 on CUDA, the whole body as one graph per number
    of splits (runners.fa4_graph; default) instead of a graph per segment with FA4 between.
    Raises ValueError for an attention this device cannot run."""

    def __init__(self, model, t: int, attention: str | None = None, fused: bool | None = None,
                 split=None, op_set: ops.Ops | None = None, proj=None, keep_states: bool = False,
                 page_rows: int | None = None, fa4_in_graph: bool = True,
                 return_states: bool = True, side_stream=None):
        self.model, self.t, self.side_stream = model, t, side_stream
        self.page_rows = page_rows or max(64, t)      # a whole chunk's rows by default
        dev, cfg, dt = model.device, model.cfg, model.dtype
        self.use_graphs = dev.type == "cuda"
        attention = attention or default_attention(dev, dt)
        if attention not in ATTENTIONS or (self.use_graphs and attention == "sdpa") or (
                attention in _BETWEEN and not _BETWEEN[attention].available(dev, dt)):
            raise ValueError(f"attention must be one of {ATTENTIONS} ('table' on CUDA, 'fa4' "
                             f"there on Hopper in fp16 or bf16 with flash-attn-4 installed, "
                             f"'sdpa' without graphs; torch's FlashAttention-2 reads no page "
                             f"table), got {attention!r} on {dev} in {dt}")
        self.attention, self.table = attention, attention == "table"
        self.ops = op_set or (ops.fused_ops() if (self.use_graphs if fused is None else fused)
                              else ops.EAGER)
        if proj is None and self.ops is not ops.EAGER:
            from adapters.model.fuse import fuse_projections
            proj = fuse_projections(model)
        self.proj = proj
        z = lambda *shape, dtype=dt: torch.zeros(*shape, device=dev, dtype=dtype)  # noqa: E731
        self.full_layers = [i for i, x in enumerate(model.layers) if x.layer_type == FULL]
        self.gdn_index = {i: g for g, i in enumerate(cfg.linear_layers)}   # layer -> GDN slot
        self.num_full = len(self.full_layers)
        # the eager attention between graphs: FA4's, one per runner
        self._between = fa4.FA4Attention(cfg.num_attention_heads, cfg.num_key_value_heads) \
            if attention == "fa4" else None
        # FA4 inside the chunk's graph: fixed tables built on the device, one graph a split
        # (fa4_graph's Triton kernel is imported only where FA4 runs: a CPU install has no
        # Triton)
        self.split_graphs = None
        if attention == "fa4" and fa4_in_graph:
            from adapters.runners import fa4_graph
            self.split_graphs = fa4_graph.SplitGraphs(t, MAX_TABLE_PAGES * self.page_rows, dev)
        self._tables = None                                # the staged chunk's SplitTables
        self.staged = ChunkMeta(t, self.num_full, self.page_rows, dev, dt,
                                None if self.split_graphs else self._between,
                                sub_pages=attention == "fa4")
        self.meta = self.staged.meta                       # what the graphs read
        self.steps = torch.arange(t, device=dev)
        self.hidden = z(t, cfg.hidden_size)
        self.slots = StateSlots(cfg, dev, dt, keep_states, return_states)
        self.gdn_in, self.gdn_out = self.slots.inputs, self.slots.outputs   # the body's view
        self.attn_out = [z(t, cfg.num_attention_heads * cfg.head_dim) for _ in self.full_layers]
        if attention != "sdpa":                          # these write KV rows with write_kv
            from adapters.attention import table
            self._at = table
        if self.table:
            self.split = split or self._at.READ
            self.scratch = self._at.scratch(t, cfg.num_attention_heads, cfg.head_dim,
                                            self.split, dev)
        self._plan = None                                  # FA4's, for the staged chunk
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self._prepared = False
        self.picks = "none"              # model.picks.picks_digest, at `prepare`
        self._carry: list = [None] * (self.num_full + 1)   # (x, gate, rope) out of segment j
        self._qkv: list = [None] * self.num_full           # q, k, v out of segment j
        self._pos, self._kv = 0, None                      # the eager attention's inputs

    @property
    def graph(self):
        """The captured graphs (None before capture or without graphs): `graphs or None`,
        with FA4 in the graph those of every split."""
        return (self.split_graphs.all() if self.split_graphs else self.graphs) or None

    def captures(self) -> dict:
        """num_graphs (held now), num_captures, num_failed_captures and capture_s (seconds,
        since the start): with FA4 in the graph those of its SplitGraphs (one graph a split
        count and pool), else the segments' graphs of the warm-up (captured together, their
        time not counted: 0.0)."""
        if self.split_graphs is not None:
            return self.split_graphs.captures()
        return {"num_graphs": len(self.graphs), "num_captures": len(self.graphs),
                "num_failed_captures": 0, "capture_s": 0.0}

    def _write_kv(self, j: int, k, v) -> None:
        """k, v [T, Hkv, D] of full-attention layer j into rows [pos, pos + T) of the
        sequence's pages, the pools' places, pos and the page table read from meta (inside
        a graph: no host call)."""
        m = self.staged
        self._at.write_kv(self._at.kv_rows(k), self._at.kv_rows(v), m.pool_base, m.places(j),
                          m.pos, m.table(), self.page_rows)

    def _pages(self, j: int):
        """Layer j's LayerPages over the pools of this run, its table a view of meta."""
        from adapters.attention.paged import LayerPages
        k, v = self._kv.pool.layer(j)
        return LayerPages(k, v, self.staged.table(self.staged.num_pages))

    def _attend(self, j: int) -> None:
        """Full-attention layer j (in order): attend its q into attn_out[j] (the table and sdpa
        attentions also write its k, v here; fa4's were written inside its segment)."""
        (q, k, v), out = self._qkv[j], self.attn_out[j]
        if self._tables is not None:                    # FA4 over the device-built tables
            from adapters.runners import fa4_graph
            side = self._between.split_stream(q.device) if self._between.overlap and \
                q.is_cuda else None
            fa4_graph.attend(fa4.forward(), q, *self._kv.pool.layer(j), self._tables,
                             out, side)
        elif self.table:
            m = self.staged
            self._write_kv(j, k, v)
            self._at.attend_table(q.contiguous(), m.pool_base, m.places(j), m.pos,
                                  self.model.cfg.num_key_value_heads, *self.scratch, out,
                                  self.split, m.table(), self.page_rows)
        elif self.attention in _BETWEEN:
            if self._plan is None:      # after the first graph's launch: ChunkMeta.stage_plan
                self._plan = self.staged.stage_plan()
            self._between.attend(q, self._pos, *self._kv.pool.layer(j), self._plan, out)
        else:
            attn = self.model.layers[self.full_layers[j]].self_attn
            out.copy_(attn.attend(q, k, v, self._pos, self._pages(j)))

    def _finish(self, i: int, x, h):
        """The rest of layer i after its mixer: residual, post norm, MLP, the next layer's norm
        (or, after the last layer, the final hidden). Returns (x, h)."""
        m, op, eps = self.model, self.ops, self.model.cfg.rms_norm_eps
        layer = m.layers[i]
        x, h = op.add_rms_norm(x, h, layer.post_attention_layernorm.weight, eps)
        h = layer.mlp(h, op, self.proj and self.proj.mlp_in[i])
        if i + 1 < len(m.layers):
            return op.add_rms_norm(x, h, m.layers[i + 1].input_layernorm.weight, eps)
        self.hidden.copy_(x + h)
        return x, h

    def _segment(self, j: int) -> None:
        """Segment j of the chunk forward (Qwen35.forward's ops in the same order, each residual
        add joined to the norm after it): from full-attention layer j - 1's output projection
        (or the embedding) to full-attention layer j's q/k/v projection (or the final hidden)."""
        m, cfg, op = self.model, self.model.cfg, self.ops
        if j == 0:
            x = m.embed_tokens(self.meta[:self.t])
            rope = rope_cos_sin(self.steps + self.meta[self.t], cfg.rotary_dim, cfg.rope_theta,
                                x.dtype)
            h, start = op.rms_norm(x, m.layers[0].input_layernorm.weight, cfg.rms_norm_eps), 0
        else:
            x, gate, rope = self._carry[j - 1]
            i = self.full_layers[j - 1]
            h = m.layers[i].self_attn.output(self.attn_out[j - 1], gate, op)
            x, h = self._finish(i, x, h)
            start = i + 1
        stop = self.full_layers[j] if j < self.num_full else len(m.layers)
        for i in range(start, stop):                                # GDN layers only
            g = self.gdn_index[i]
            # the new states stay where the body put them (in the graph's memory pool)
            h, *self.gdn_out[g] = m.layers[i].linear_attn(h, *self.gdn_in[g], m.kernels, op,
                                                          self.proj and self.proj.gdn_in[i])
            x, h = self._finish(i, x, h)
        if j < self.num_full:
            q, k, v, gate = m.layers[stop].self_attn.project(h, rope, op,
                                                             self.proj and self.proj.attn_in[stop])
            if self.attention in _BETWEEN:
                self._write_kv(j, k, v)
            self._qkv[j], self._carry[j] = (q, k, v), (x, gate, rope)

    def _body(self) -> None:
        """Every segment with the attention between (eagerly, or inside the table graph; with
        FA4 in the graph, after the kernel that builds its tables)."""
        if self._tables is not None:
            self._tables.fill(self.meta, self.t, self.staged.table_at, self.page_rows)
        for j in range(self.num_full + 1):
            self._segment(j)
            if j < self.num_full:
                self._attend(j)

    def prepare(self, pool=None) -> None:
        """Compile and capture now (on CUDA; nothing to do without graphs), so that the first
        real chunk does not pay for it (about a minute with the fused ops' first compile);
        with FA4 in the graph and `pool` (the reader's block_store.KvPool) given, its graphs
        over that pool too (capture.capture_splits).
        With fla's configs pinned (SHADOW_AUTOTUNE_DIR, model.autotune), the picks the warm-up
        made are written there, for the next process to load instead of tuning its own."""
        if not self.use_graphs:
            return
        if not self._prepared:
            with torch.no_grad(), picks.recording() as used:
                capture.capture(self)
            self.picks = picks.picks_digest(used)        # what its chunks' bits were tuned to
            self._prepared = True
            pinned = autotune.pinned_dir()
            if pinned is not None:
                autotune.export(pinned)
        if pool is not None:
            with torch.no_grad():
                capture.capture_splits(self, pool)

    def _stage(self, ids, pos: int, kv) -> None:
        """ChunkMeta.stage: ids, pos, the pools' places and kv's page table where the graphs
        read them; FA4's plan (self._plan) is staged at the first attention."""
        self.staged.stage(ids, pos, kv)
        self._plan = None
        if self.split_graphs:
            s = self._between.num_splits(pos, self.t, self.meta.device)
            self._tables = self.split_graphs.tables_for(s)

    def _replay(self) -> None:
        """The captured graphs in order, FA4 between them; with FA4 in the graph, the one
        graph of the staged chunk's splits over its pool (fa4_graph.SplitGraphs.replay)."""
        if self.split_graphs:
            self.split_graphs.replay(self._tables.s, self._kv.pool, self._body, self.slots)
            return
        for j, graph in enumerate(self.graphs):
            graph.replay()
            if j < self.num_full and not self.table:
                self._attend(j)

    @torch.no_grad()
    def run(self, ids, pos: int, kv, gdn: list):
        """Same contract as Qwen35.forward for T = self.t (ids: a list of T ints, not checked
        further, the reader validates them, or [T] int64 on any device; kv: a
        block_store.PagedKv whose pages hold rows >= pos + T, pages of this runner's
        page_rows): writes KV rows [pos, pos + T), returns (hidden [T, hidden], the new gdn
        list or, from a runner made with return_states=False, None); the given states are
        not changed.

        Raises ValueError for a chunk of another length, a negative pos, or pages that are too
        few, of another size, more than the runner's table holds, or a pool that is not
        16-byte aligned (the kernels' vectorised loads assume it; runners.meta)."""
        if isinstance(ids, tuple):
            ids = list(ids)
        shape = (len(ids),) if isinstance(ids, list) else tuple(ids.shape)
        if shape != (self.t,):
            raise ValueError(f"a chunk of {self.t} ids expected, got shape {shape}")
        if pos < 0:                 # write_kv would write below the buffers, unchecked
            raise ValueError(f"pos must be >= 0, got {pos}")
        if kv.num_rows < pos + self.t or kv.page_rows != self.page_rows or \
                len(kv.pages) > MAX_TABLE_PAGES:       # the pools' alignment: ChunkMeta.stage
            raise ValueError(f"{len(kv.pages)} pages of {kv.page_rows} rows cannot take rows "
                             f"up to {pos + self.t} (this runner: pages of {self.page_rows} "
                             f"rows, at most {MAX_TABLE_PAGES} a sequence)")
        self.prepare()
        self._stage(ids, pos, kv)                      # FA4's plan at the first attention
        self.slots.feed(gdn)
        self._pos, self._kv = pos, kv
        try:
            self._replay() if self.use_graphs else self._body()
        finally:
            self._kv = None
        return self.hidden.clone(), self.slots.take() if self.slots.returned else None
