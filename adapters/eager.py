"""The eager paths: Qwen35.forward chunk by chunk, no graphs, no runners.

EagerAdapter uses the model's own kernel set (fla on CUDA, the pure-torch kernels on the CPU);
ReferenceAdapter uses the pure-torch kernels (adapters.model.ref: chunked GDN in fp32, SDPA
attention) on any device: the CPU path, and the oracle the fast paths are tested against.
Both take `path` 'eager'; the kernel set's name tells them apart in a file's identity.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.interface import Adapter
from adapters.model.kernels import TORCH, KernelSet
from adapters.model.qwen35 import Qwen35
from block_store import PagedKv
from block_store.memory.layout import GdnState


class EagerAdapter(Adapter):
    """Qwen35.forward for every forward (args: model, grid; kernels: the GDN kernel set,
    default the model's)."""

    def __init__(self, model: Qwen35, grid: int, kernels: KernelSet | None = None):
        super().__init__(model, grid)
        self._kernels = kernels or model.kernels

    @property
    def kernels(self) -> KernelSet:
        return self._kernels

    @property
    def path(self) -> str:
        return "eager"

    def read_chunk(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        _, new = self.model(self._ids(ids), pos, kv, gdn, self._kernels)
        return new

    def fork_logits(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState,
                    token_ids: Sequence[int]) -> torch.Tensor:
        hidden, _ = self.model(self._ids(ids), pos, kv, gdn, self._kernels)
        return self.model.logits(hidden[-1:], self._ids(token_ids))[0].float()


class ReferenceAdapter(EagerAdapter):
    """EagerAdapter over the pure-torch kernels (adapters.model.kernels.TORCH) on any device."""

    def __init__(self, model: Qwen35, grid: int):
        super().__init__(model, grid, TORCH)
