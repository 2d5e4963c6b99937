"""The Qwen3.5 text model as a pure function of (ids, start position, state views).

State lives outside the model (block_store's layouts); a forward writes KV rows into the pages it
is given and returns new GDN states instead of changing the old ones, so a fork needs no undo for
the recurrent and conv states.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from adapters.attention.paged import layer_pages
from adapters.model import batch
from adapters.model.config import FULL, ModelConfig
from adapters.model.kernels import TORCH, KernelSet
from adapters.model.layers import MLP, Attention, GatedDeltaNet, RMSNorm, rope_cos_sin
from adapters.model.ops import EAGER


@dataclass(frozen=True)
class ModelInfo:
    """Where the weights came from: `name` (preset or directory), `fingerprint` (xxh3-128 hex over
    the stored tensors' names, shapes, dtypes and bytes), `is_random` (seeded random weights)."""

    name: str
    fingerprint: str
    is_random: bool


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        if layer_type == FULL:
            self.self_attn = Attention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)


class Qwen35(nn.Module):
    """Qwen3.5 text model (embed -> layers -> final norm -> tied or untied head).

    Parameter names are those of a Hugging Face checkpoint after the `model.` or
    `model.language_model.` prefix is stripped (plus `lm_head.weight` when untied).
    """

    def __init__(self, cfg: ModelConfig, kernels: KernelSet = TORCH,
                 info: ModelInfo | None = None):
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.info = info or ModelInfo("unnamed", "", True)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, t) for t in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def head_weight(self) -> torch.Tensor:
        """[vocab, hidden]: the embedding when tied, else lm_head."""
        return self.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, pos: int, kv: list, gdn: list,
                kernels: KernelSet | None = None, row_tile: int | None = None,
                linear: Callable | None = None):
        """Run one chunk (GDN through `kernels`, default the model's own set). row_tile: every
        projection over the rows padded to a multiple of it (model.batch.tiled_linear: the
        GEMMs a sequence's rows meet in forward_batch; no change for T a multiple of it).
        linear: the projections' GEMM (x [T, K], w [N, K]) -> [T, N] instead of F.linear
        (model.invariant.linear: the batch-invariant one).

        Args:
            ids: [T] int64 on the model's device, absolute positions [pos, pos + T).
            kv: a block_store.PagedKv (pools [num_pages, G, Hkv, D] per full-attention
                layer in the model dtype, a page table holding rows >= pos + T); rows [0, pos)
                hold the prefix, rows [pos, pos + T) are written.
            gdn: per linear layer (in layer order) a pair (conv_state [conv_dim, W] model dtype,
                rec_state [HV, K, V] fp32) after token pos; not modified.
        Returns:
            (hidden [T, hidden] before the final norm, new gdn list of (conv, rec) pairs).
        """
        base = linear or EAGER.linear
        op = replace(EAGER, linear=base if row_tile is None else
                     batch.tiled_linear(row_tile, base))
        x = self.embed_tokens(ids)
        rope = self._rope(pos, ids.shape[0], x.dtype)
        kv_iter, gdn_iter, new_gdn = iter(layer_pages(kv)), iter(gdn), []
        for layer in self.layers:
            h = layer.input_layernorm(x)
            if layer.layer_type == FULL:
                h = layer.self_attn(h, pos, next(kv_iter), rope, op)
            else:
                conv, rec = next(gdn_iter)
                h, conv, rec = layer.linear_attn(h, conv, rec, kernels or self.kernels, op)
                new_gdn.append((conv, rec))
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x), op)
        return x, new_gdn

    def _rope(self, pos: int, t: int, dtype: torch.dtype):
        """cos, sin [t, rotary_dim] for positions [pos, pos + t)."""
        positions = torch.arange(pos, pos + t, device=self.device)
        return rope_cos_sin(positions, self.cfg.rotary_dim, self.cfg.rope_theta, dtype)

    @torch.no_grad()
    def forward_batch(self, seqs: Sequence[tuple], kernels: KernelSet | None = None,
                      row_tile: int = batch.ROW_TILE, linear: Callable | None = None):
        """Several sequences in one forward (GDN through `kernels`, default the model's own):
        the embedding, the norms, the residual adds and every projection over all their rows
        at once (one buffer, each sequence's rows padded to a multiple of row_tile:
        model.batch.RowTiles); RoPE, attention, the GDN conv, gates and recurrence, the gated
        norms and the MLP's SiLU per sequence through its own pages and states. Each
        sequence's results have the bits of forward(ids_b, pos_b, kv_b, gdn_b,
        row_tile=row_tile) alone (model.batch says why; tests/unit/test_batch_forward.py), and
        of forward(...) without it for a length that is a multiple of row_tile when
        rows_invariant holds. linear: the projections' GEMM instead of F.linear, as forward's
        (the same one for the alone forwards the bits are those of).

        Args:
            seqs: per sequence (ids [T_b] int64 on the model's device, pos_b, kv_b a
                block_store.PagedKv holding rows >= pos_b + T_b, gdn_b as forward's); KV rows
                [pos_b, pos_b + T_b) of kv_b are written. No two may write the same page.
        Returns:
            ([hidden [T_b, hidden] before the final norm, per sequence], [new gdn list per
            sequence]); the gdn inputs are not modified.
        Raises ValueError for no sequence or an empty one."""
        kernels = kernels or self.kernels
        op = EAGER if linear is None else replace(EAGER, linear=linear)
        tiles = batch.RowTiles(tuple(int(s[0].shape[0]) for s in seqs), row_tile)
        x = self.embed_tokens(tiles.pad([s[0] for s in seqs]))
        ropes = [self._rope(pos, ids.shape[0], x.dtype) for ids, pos, _, _ in seqs]
        pages = [iter(layer_pages(kv)) for _, _, kv, _ in seqs]
        states = [iter(g) for *_, g in seqs]
        new_gdn: list[list] = [[] for _ in seqs]
        for layer in self.layers:
            h = layer.input_layernorm(x)
            if layer.layer_type == FULL:
                attn = layer.self_attn
                parts = tiles.split_all(attn.project_rows(h, op))
                outs = [attn.mix(*parts[b], seqs[b][1], next(pages[b]), ropes[b])
                        for b in range(len(seqs))]
                h = op.linear(tiles.pad(outs), attn.o_proj.weight)
            else:
                gdn = layer.linear_attn
                parts = tiles.split_all(gdn.project(h, op))
                outs = []
                for b in range(len(seqs)):
                    o, conv, rec = gdn.mix(*parts[b], *next(states[b]), kernels)
                    new_gdn[b].append((conv, rec))
                    outs.append(o)
                h = op.linear(tiles.pad(outs), gdn.out_proj.weight)
            x = x + h
            mlp = layer.mlp
            parts = tiles.split_all(mlp.gate_up(layer.post_attention_layernorm(x), op))
            act = tiles.pad([EAGER.swiglu(g, u) for g, u in parts])
            x = x + op.linear(act, mlp.down_proj.weight)
        return tiles.split(x), new_gdn

    def gemms_keep_tile_bits(self, num_rows: int, row_tile: int = batch.ROW_TILE,
                             linear: Callable | None = None) -> bool:
        """Whether this machine's GEMMs (`linear`, default F.linear) over num_rows rows (a
        multiple of row_tile) give every row the bits of a GEMM over its own row_tile rows,
        for one weight of each shape the model has (batch.linear_keeps_tile_bits, with the
        threads torch uses now)."""
        return batch.linear_keeps_tile_bits(self._weights_by_shape(), num_rows, row_tile,
                                            linear=linear or EAGER.linear)

    def _weights_by_shape(self) -> list[torch.Tensor]:
        """One nn.Linear weight of each (shape, dtype) the model has."""
        shapes = {}
        for w in (m.weight for m in self.modules() if isinstance(m, nn.Linear)):
            shapes.setdefault((tuple(w.shape), w.dtype), w)
        return list(shapes.values())

    def rows_invariant(self, rows: int, row_tile: int = batch.ROW_TILE,
                       linear: Callable | None = None) -> bool:
        """Whether this machine's GEMMs (`linear`, default F.linear) give a row of a sequence
        of `rows` rows (a multiple of row_tile) the same bits in forward and in forward_batch
        with others (batch.linear_rows_invariant over one weight of each shape the model has:
        with the threads torch uses now)."""
        return batch.linear_rows_invariant(self._weights_by_shape(), rows, tile=row_tile,
                                           linear=linear or EAGER.linear)

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm and head on hidden [N, hidden] -> logits [N, vocab] (or [N, len(token_ids)]
        for only those rows of the head), in the model dtype."""
        w = self.head_weight()
        if token_ids is not None:
            w = w[token_ids]
        return self.norm(hidden) @ w.t()
