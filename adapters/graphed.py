"""The CUDA-graph path: every forward through a reader's runners (adapters.runners.runners:
the grid chunk runner, question runners padded to row buckets (Runners.rows_of), the
single-token runner and its device-fed decode loop). On CUDA each runner replays CUDA graphs
with FlashAttention-4 or -2 (or the table attention) between them; on the CPU the same bodies
run without graphs.
Forks and fresh prefills go through the same chunk runner as reads, so its bits are the
reference on CUDA. Batches (`read_chunks`, `fork_logits_batch`) run one at a time here for
now (the Adapter's default): cuBLAS picks its GEMM kernels by the row count, so a batched
forward on CUDA needs GEMMs with fixed tiles and no split-K, and graphs per batch shape.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from adapters.interface import Adapter, check_rows
from adapters.model.qwen35 import Qwen35
from adapters.runners.runners import Runners
from block_store import PagedKv
from block_store.memory.layout import GdnState


class GraphAdapter(Adapter):
    """Args: model, grid; attention, fused, split: the runners' options (Runners); runners: a
    Runners for this model and grid built elsewhere (tests pass smaller buckets). Raises
    ValueError for an attention this device cannot run or a tiling of another attention."""

    def __init__(self, model: Qwen35, grid: int, attention: str | None = None,
                 fused: bool | None = None, split=None, runners: Runners | None = None):
        super().__init__(model, grid)
        self.runners = runners or Runners(model, grid, attention, fused=fused, split=split)
        if self.runners.chunk.t != grid:
            raise ValueError(f"the runners read chunks of {self.runners.chunk.t} ids, the "
                             f"grid is {grid}")

    @property
    def path(self) -> str:
        return self.runners.path

    def prepare(self, pool=None, kept_rows: Sequence[int] = ()) -> None:
        self.runners.prepare(pool=pool, kept_rows=kept_rows)

    def graph_stats(self) -> dict:
        """Runners.captures: the runners, their graphs and what capturing them took."""
        return self.runners.captures()

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
        the largest bucket."""
        ids = list(ids)
        runner = self.runners.for_rows(len(ids))
        if runner is not None:
            padded = torch.tensor(ids + [ids[-1]] * (runner.t - len(ids)), dtype=torch.long)
            hidden, _ = runner.run(padded, pos, kv, gdn)
            hidden = hidden[len(ids) - 1:len(ids)]
        else:
            hidden, _ = self.model(self._ids(ids), pos, kv, gdn)
        return self.model.logits(hidden[-1:], self._ids(token_ids))[0].float()

    def decode_burst(self, token: int, pos: int, kv: PagedKv, gdn: GdnState, max_steps: int,
                     stop_ids: set[int]) -> tuple[list[int], int, GdnState]:
        """Through the decode loop (adapters.runners.decode: the single-token runner, each token
        fed back on the device); the states are copied out of the runner (another fork may
        run it next)."""
        loop = self.runners.decode_loop()
        out, steps = loop.run(token, pos, kv, gdn, max_steps, stop_ids)
        return out, steps, loop.states()
