"""The Qwen3.5 text model as a pure function of (ids, start position, state views).

State lives outside the model (block_store's layouts); a forward writes KV rows into the pages it
is given and returns new GDN states instead of changing the old ones, so a fork needs no undo for
the recurrent and conv states.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from adapters.attention.paged import layer_pages
from adapters.model.config import FULL, ModelConfig
from adapters.model.kernels import TORCH, KernelSet
from adapters.model.layers import MLP, Attention, GatedDeltaNet, RMSNorm, rope_cos_sin


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
                kernels: KernelSet | None = None):
        """Run one chunk (GDN through `kernels`, default the model's own set).

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
        cfg = self.cfg
        x = self.embed_tokens(ids)
        positions = torch.arange(pos, pos + ids.shape[0], device=ids.device)
        rope = rope_cos_sin(positions, cfg.rotary_dim, cfg.rope_theta, x.dtype)
        kv_iter, gdn_iter, new_gdn = iter(layer_pages(kv)), iter(gdn), []
        for layer in self.layers:
            h = layer.input_layernorm(x)
            if layer.layer_type == FULL:
                h = layer.self_attn(h, pos, next(kv_iter), rope)
            else:
                conv, rec = next(gdn_iter)
                h, conv, rec = layer.linear_attn(h, conv, rec, kernels or self.kernels)
                new_gdn.append((conv, rec))
            x = x + h
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, new_gdn

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, token_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final norm and head on hidden [N, hidden] -> logits [N, vocab] (or [N, len(token_ids)]
        for only those rows of the head), in the model dtype."""
        w = self.head_weight()
        if token_ids is not None:
            w = w[token_ids]
        return self.norm(hidden) @ w.t()
