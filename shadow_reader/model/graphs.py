"""CUDA graphs for whole-chunk reads: the chunk forward of Qwen35 as one graph per stretch of
layers between two full-attention layers; the attention itself (KV write and SDPA over a length
that grows with C) runs eagerly between the graphs.

The eager forward (`Qwen35.forward`) is the reference: a segment runs the very same module calls
on static copies of the same inputs, so its kernels see the same values and shapes. Whether the
bits agree with the eager path on a given GPU is measured, not assumed (bench/read.py --graphs
and the device check compare the committed state with an eager fresh prefill).

Static buffers (all on the model's device): ids [T] int64, positions [T] int64, cos/sin
[T, rotary_dim], the residual x [T, hidden] between segments, per full-attention layer q
[T, H, D], k and v [T, Hkv, D], gate and attention output [T, H * D], per GDN layer the input
and output states (conv [conv_dim, W], recurrent [HV, K, V] fp32), and the final hidden [T, hidden].
"""
from __future__ import annotations

import torch

from .config import FULL
from .layers import rope_cos_sin


class ChunkGraphs:
    """Runs chunks of exactly `t` ids through `model` with CUDA graphs. On the CPU the same
    segments run without graphs (so the CPU tests check the split against Qwen35.forward)."""

    def __init__(self, model, t: int):
        self.model, self.t = model, t
        self.use_graphs = model.device.type == "cuda"
        cfg, dev, dt = model.cfg, model.device, model.dtype
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        z = lambda *shape, dtype=dt: torch.zeros(*shape, device=dev, dtype=dtype)  # noqa: E731
        self.ids, self.positions = z(t, dtype=torch.long), z(t, dtype=torch.long)
        self.cos, self.sin = z(t, cfg.rotary_dim), z(t, cfg.rotary_dim)
        self.x, self.hidden = z(t, cfg.hidden_size), z(t, cfg.hidden_size)
        n_full = len(cfg.full_layers)
        self.q = [z(t, h, d) for _ in range(n_full)]
        self.k = [z(t, hkv, d) for _ in range(n_full)]
        self.v = [z(t, hkv, d) for _ in range(n_full)]
        self.gate = [z(t, h * d) for _ in range(n_full)]
        self.o = [z(t, h * d) for _ in range(n_full)]
        hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv = (cfg.conv_dim, cfg.linear_conv_kernel_dim)
        self.gdn_in = [(z(*conv), z(hv, kd, vd, dtype=torch.float32)) for _ in cfg.linear_layers]
        self.gdn_out = [(z(*conv), z(hv, kd, vd, dtype=torch.float32)) for _ in cfg.linear_layers]
        self.spans = self._spans()
        self.graphs: list[torch.cuda.CUDAGraph] = []

    def _spans(self) -> list[list[int]]:
        """Layer indices run by each segment, split after each full-attention layer."""
        spans, cur = [], []
        for i, kind in enumerate(self.model.cfg.layer_types):
            cur.append(i)
            if kind == FULL:
                spans.append(cur)
                cur = []
        spans.append(cur)
        return spans

    def _segment(self, s: int) -> None:
        """Segment s: finish attention s-1 (output, residual, MLP), run the GDN layers up to
        the next full-attention layer, project that layer's q, k, v, gate into the statics."""
        m, cfg = self.model, self.model.cfg
        if s == 0:
            x = m.embed_tokens(self.ids)
            cos, sin = rope_cos_sin(self.positions, cfg.rotary_dim, cfg.rope_theta, x.dtype)
            self.cos.copy_(cos)
            self.sin.copy_(sin)
        else:
            layer = m.layers[cfg.full_layers[s - 1]]
            x = self.x + layer.self_attn.output(self.o[s - 1], self.gate[s - 1])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for i in self.spans[s]:
            layer = m.layers[i]
            if layer.layer_type == FULL:
                q, k, v, gate = layer.self_attn.project(layer.input_layernorm(x),
                                                        (self.cos, self.sin))
                for dst, src in ((self.q[s], q), (self.k[s], k), (self.v[s], v),
                                 (self.gate[s], gate)):
                    dst.copy_(src)
                self.x.copy_(x)
                return
            j = cfg.linear_layers.index(i)
            h, conv, rec = layer.linear_attn(layer.input_layernorm(x), *self.gdn_in[j],
                                             m.kernels)
            self.gdn_out[j][0].copy_(conv)
            self.gdn_out[j][1].copy_(rec)
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.hidden.copy_(x)

    def _attend(self, s: int, pos: int, kv) -> None:
        attn = self.model.layers[self.model.cfg.full_layers[s]].self_attn
        self.o[s].copy_(attn.attend(self.q[s], self.k[s], self.v[s], pos, *kv[s]))

    def _capture(self) -> None:
        """Warm up (Triton autotuning, cuBLAS handles) on a side stream, then capture."""
        cfg, dev, dt = self.model.cfg, self.model.device, self.model.dtype
        rows = (self.t, cfg.num_key_value_heads, cfg.head_dim)
        kv = [(torch.zeros(rows, device=dev, dtype=dt), torch.zeros(rows, device=dev, dtype=dt))
              for _ in cfg.full_layers]
        self.positions.copy_(torch.arange(self.t, device=dev))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                for s in range(len(self.spans)):
                    self._segment(s)
                    if s < len(cfg.full_layers):
                        self._attend(s, 0, kv)
        torch.cuda.current_stream().wait_stream(side)
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            for s in range(len(self.spans)):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._segment(s)
                self.graphs.append(graph)

    @torch.no_grad()
    def run(self, ids: torch.Tensor, pos: int, kv: list, gdn: list):
        """Same contract as Qwen35.forward for T = self.t: writes KV rows [pos, pos + T),
        returns (hidden [T, hidden], new gdn list); the given states are not changed."""
        if self.use_graphs and not self.graphs:
            self._capture()
        self.ids.copy_(ids)
        self.positions.copy_(torch.arange(pos, pos + self.t, device=ids.device))
        for (ci, ri), (c, r) in zip(self.gdn_in, gdn):
            ci.copy_(c)
            ri.copy_(r)
        for s in range(len(self.spans)):
            if self.use_graphs:
                self.graphs[s].replay()
            else:
                self._segment(s)
            if s < len(self.model.cfg.full_layers):
                self._attend(s, pos, kv)
        return self.hidden.clone(), [(c.clone(), r.clone()) for c, r in self.gdn_out]
