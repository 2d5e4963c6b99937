"""Whole-chunk reads as one CUDA graph: embedding, all layers (GDN and full attention), into
static buffers; replayed for every chunk of every session. `Runners` holds a reader's runners:
grid chunks (what commits state), questions padded to 256-row buckets, single-token decode.

What varies between chunks reaches the graph through device memory, not through the graph's
baked arguments: the ids, the start position and the addresses of the session's KV buffers sit
in one int64 buffer `meta` = [ids (T) | pos | k_ptr, v_ptr per full-attention layer], filled by
one host-to-device copy from pinned memory; the GDN states are copied into static inputs (one
multi-tensor copy). Attention is attn_triton's table-addressed kernel (KV write and attention),
the only kernel that reads a position or an address at replay.

Without graphs (the CPU) the same body runs eagerly, with the eager attention
(`Attention.attend`, SDPA) unless `attention="table"` (Triton's interpreter in the tests): the
split of the forward is then checked against Qwen35.forward bit for bit.

Static buffers (the model's device): meta [T + 1 + 2 * num_full] int64, per GDN layer the input
and output states (conv [conv_dim, W] model dtype, recurrent [HV, K, V] fp32), the final hidden
[T, hidden]; for the table attention its split scratch (attn_triton.scratch).
"""
from __future__ import annotations

import torch

from . import ops
from .config import FULL
from .layers import rope_cos_sin


def _flat(pairs) -> list[torch.Tensor]:
    return [x for pair in pairs for x in pair]


class ChunkGraphs:
    """Runs chunks of exactly `t` ids through `model`; one CUDA graph on CUDA.

    attention: "table" (attn_triton; the default on CUDA) or "sdpa" (Attention.attend, eager
    only: the default on the CPU). fused: the layer's small ops through torch.compile
    (ops.fused_ops; default on CUDA), else ops.EAGER. split: the attention's tiling
    (attn_triton.SplitConfig, default attn_triton.READ; the committed bits depend on it).
    op_set: the ops to use, overriding `fused` (Runners shares one compiled set)."""

    def __init__(self, model, t: int, attention: str | None = None, fused: bool | None = None,
                 split=None, op_set: ops.Ops | None = None):
        self.model, self.t = model, t
        dev = model.device
        self.use_graphs = dev.type == "cuda"
        attention = attention or ("table" if self.use_graphs else "sdpa")
        if attention not in ("table", "sdpa") or (self.use_graphs and attention != "table"):
            raise ValueError(f"attention must be 'table' (or 'sdpa' without graphs), got {attention!r}")
        self.table = attention == "table"
        if fused is None:
            fused = self.use_graphs
        self.ops = op_set or (ops.fused_ops() if fused else ops.EAGER)
        cfg, dt = model.cfg, model.dtype
        z = lambda *shape, dtype=dt: torch.zeros(*shape, device=dev, dtype=dtype)  # noqa: E731
        self.num_full = len(cfg.full_layers)
        self.meta = z(t + 1 + 2 * self.num_full, dtype=torch.long)
        self.meta_host = torch.zeros_like(self.meta, device="cpu").pin_memory() \
            if self.use_graphs else torch.zeros_like(self.meta)
        self.meta_copied = torch.cuda.Event() if self.use_graphs else None
        self.steps = torch.arange(t, device=dev)
        self.hidden = z(t, cfg.hidden_size)
        hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv = (cfg.conv_dim, cfg.linear_conv_kernel_dim)
        self.gdn_in = [(z(*conv), z(hv, kd, vd, dtype=torch.float32)) for _ in cfg.linear_layers]
        self.gdn_out = [(z(*conv), z(hv, kd, vd, dtype=torch.float32)) for _ in cfg.linear_layers]
        if self.table:
            from . import attn_triton
            self._at, self.split = attn_triton, split or attn_triton.READ
            self.scratch = attn_triton.scratch(t, cfg.num_attention_heads, cfg.head_dim,
                                               self.split, dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self._pos, self._kv = 0, None                   # the eager body's attention inputs

    def _attend(self, attn, i: int, q, k, v) -> torch.Tensor:
        """Full-attention layer i (in order): write k, v and attend q -> [T, H * D]."""
        if not self.table:
            return attn.attend(q, k, v, self._pos, *self._kv[i])
        cfg, at = self.model.cfg, self._at
        pos, tab = self.meta[self.t:self.t + 1], self.meta[self.t + 1 + 2 * i:self.t + 3 + 2 * i]
        at.write_kv(k.contiguous(), v.contiguous(), tab, pos)
        out = torch.empty(self.t, cfg.num_attention_heads * cfg.head_dim, device=q.device,
                          dtype=q.dtype)
        return at.attend_table(q.contiguous(), tab, pos, cfg.num_key_value_heads, *self.scratch,
                               out, self.split)

    def _body(self) -> None:
        """The chunk forward from meta and gdn_in into hidden and gdn_out: Qwen35.forward's ops
        in the same order (with ops.EAGER the same bits), each residual add joined to the norm
        after it (ops.add_rms_norm)."""
        m, cfg, op = self.model, self.model.cfg, self.ops
        eps, layers = cfg.rms_norm_eps, m.layers
        x = m.embed_tokens(self.meta[:self.t])
        positions = self.steps + self.meta[self.t]
        rope = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        h = op.rms_norm(x, layers[0].input_layernorm.weight, eps)
        full = gdn = 0
        for i, layer in enumerate(layers):
            if layer.layer_type == FULL:
                attn = layer.self_attn
                q, k, v, gate = attn.project(h, rope, op)
                h = attn.output(self._attend(attn, full, q, k, v), gate, op)
                full += 1
            else:
                h, conv, rec = layer.linear_attn(h, *self.gdn_in[gdn], m.kernels, op)
                self.gdn_out[gdn][0].copy_(conv)
                self.gdn_out[gdn][1].copy_(rec)
                gdn += 1
            x, h = op.add_rms_norm(x, h, layer.post_attention_layernorm.weight, eps)
            h = layer.mlp(h, op)
            if i + 1 < len(layers):
                x, h = op.add_rms_norm(x, h, layers[i + 1].input_layernorm.weight, eps)
        self.hidden.copy_(x + h)

    def _capture(self) -> None:
        """Warm up (Triton compiles, cuBLAS handles) on a side stream with KV rows of its own
        (pos 0), then capture the body."""
        cfg, dev, dt = self.model.cfg, self.model.device, self.model.dtype
        rows = (self.t, cfg.num_key_value_heads, cfg.head_dim)
        kv = [(torch.zeros(rows, device=dev, dtype=dt), torch.zeros(rows, device=dev, dtype=dt))
              for _ in range(self.num_full)]
        self._stage(torch.zeros(self.t, dtype=torch.long), 0, kv)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                self._body()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize(dev)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph):
            self._body()

    def prepare(self) -> None:
        """Compile and capture now (on CUDA; nothing to do without graphs), so that the first
        real chunk does not pay for it (about a minute with the fused ops' first compile)."""
        if self.use_graphs and self.graph is None:
            with torch.no_grad():
                self._capture()

    def _stage(self, ids: torch.Tensor, pos: int, kv: list) -> None:
        """ids, pos and the KV addresses into meta: one copy from pinned memory on CUDA."""
        if self.meta_copied is not None:
            self.meta_copied.synchronize()          # the last copy has read meta_host
        host = self.meta_host
        host[:self.t].copy_(ids)
        ptrs = [pos] + [x.data_ptr() for x in _flat(kv)] if self.table else [pos]
        host[self.t:self.t + len(ptrs)] = torch.tensor(ptrs, dtype=torch.long)
        self.meta.copy_(host, non_blocking=True)
        if self.meta_copied is not None:
            self.meta_copied.record()

    @torch.no_grad()
    def run(self, ids: torch.Tensor, pos: int, kv: list, gdn: list):
        """Same contract as Qwen35.forward for T = self.t (ids [T] int64 on any device; every
        KV buffer contiguous with capacity >= pos + T): writes KV rows [pos, pos + T), returns
        (hidden [T, hidden], new gdn list); the given states are not changed.

        Raises ValueError for a chunk of another length or a KV buffer that is too small, not
        contiguous or not 16-byte aligned (the kernel addresses rows by pointer, unchecked)."""
        if ids.shape != (self.t,):
            raise ValueError(f"a chunk of {self.t} ids expected, got shape {tuple(ids.shape)}")
        for buf in _flat(kv):
            if buf.shape[0] < pos + self.t or not buf.is_contiguous() or buf.data_ptr() % 16:
                raise ValueError(f"KV buffer {tuple(buf.shape)} cannot take rows up to "
                                 f"{pos + self.t} (contiguous: {buf.is_contiguous()}, address "
                                 f"{buf.data_ptr():#x} must be 16-byte aligned)")
        self.prepare()
        self._stage(ids, pos, kv)
        for part in (0, 1):                         # conv states, then recurrent (one dtype each)
            torch._foreach_copy_([x[part] for x in self.gdn_in], [x[part] for x in gdn])
        if self.graph is not None:
            self.graph.replay()
        else:
            self._pos, self._kv = pos, kv
            self._body()
            self._kv = None
        out = []
        for part in (0, 1):
            src = [x[part] for x in self.gdn_out]
            out.append([torch.empty_like(x) for x in src])
            torch._foreach_copy_(out[-1], src)
        return self.hidden.clone(), list(zip(*out))


class Runners:
    """A reader's chunk runners: `chunk` for grid chunks (what commits state), and lazily one
    per question length bucket (`for_rows`: forwards padded to a multiple of BUCKET rows, at
    most MAX_ROWS) and one for single-token decode steps (`decode`, attn_triton.DECODE tiling).
    Every runner is a ChunkGraphs with the same options; `run` is the chunk runner's."""

    BUCKET = 256
    MAX_ROWS = 4096

    def __init__(self, model, grid: int, attention: str | None = None, fused: bool | None = None,
                 split=None):
        self.model = model
        self.chunk = ChunkGraphs(model, grid, attention, fused, split)
        self.options = {"attention": attention, "op_set": self.chunk.ops}   # one compiled set
        self.split = split
        self._sized: dict[int, ChunkGraphs] = {}

    def run(self, ids: torch.Tensor, pos: int, kv: list, gdn: list):
        """ChunkGraphs.run of the grid chunk runner."""
        return self.chunk.run(ids, pos, kv, gdn)

    def _get(self, t: int, split) -> ChunkGraphs:
        if t == self.chunk.t and split is self.split:    # a grid-sized bucket: the chunk runner
            return self.chunk
        if t not in self._sized:
            self._sized[t] = ChunkGraphs(self.model, t, split=split, **self.options)
        return self._sized[t]

    def for_rows(self, num_rows: int) -> ChunkGraphs | None:
        """The runner for a forward of num_rows ids padded up to a multiple of BUCKET (None past
        MAX_ROWS: forward eagerly). Padded rows come after the real ones, so they change none
        of the real rows' values; a runner's size depends only on num_rows."""
        t = -(-num_rows // self.BUCKET) * self.BUCKET
        return self._get(t, self.split) if t <= self.MAX_ROWS else None

    def prepare(self, question_rows=None) -> None:
        """Capture the chunk runner, the decode runner and the question runners for these row
        counts (default: the first 4 buckets, what the 9-class question with a tail below one
        512-id chunk needs)."""
        self.chunk.prepare()
        self.decode().prepare()
        for rows in question_rows or [self.BUCKET * k for k in range(1, 5)]:
            runner = self.for_rows(rows)
            if runner is not None:
                runner.prepare()

    def decode(self) -> ChunkGraphs:
        """The single-token runner (its attention split for one query row)."""
        from .attn_triton import DECODE
        return self._get(1, DECODE if self.chunk.table else None)
