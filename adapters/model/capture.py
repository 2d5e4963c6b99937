"""Warming up and capturing a chunk runner (model.graphs.ChunkGraphs) before its first chunk:
its body run at positions of its own over KV rows of its own (Triton, FA4 and torch.compile
compile; cuBLAS makes its handles), then its CUDA graphs captured into one memory pool.
"""
from __future__ import annotations

import torch

from . import attn_fa4


def warm_up(runner, kv, pos: int) -> None:
    """runner's body twice at pos over kv (a block_store.PagedKv), on a side stream, then a
    sync."""
    runner._stage([0] * runner.t, pos, kv)
    runner._pos, runner._kv = pos, kv
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            runner._body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize(runner.model.device)
    runner._kv = None


def capture(runner) -> None:
    """Warm up with KV rows of its own (pos 0), then capture into runner.graphs: the whole
    body (table) or each segment into one memory pool (FA4 between graphs; replayed in the
    order captured, as a shared pool requires). With FA4 in the graph (runner.split_graphs),
    a warm-up at a position with splits too (FA4 compiles each kind of call at its first), and
    no capture: its graphs name the pools, so they are made at the first chunk of each number
    of splits over a pool (model.fa4_graph.SplitGraphs)."""
    from block_store import contiguous_kv

    from .config import spec_for
    cfg, dev, dt = runner.model.cfg, runner.model.device, runner.model.dtype
    at = 2 * attn_fa4.MIN_SPLIT_KEYS if runner.split_graphs else 0
    kv = contiguous_kv(spec_for(cfg, dev, dt), runner.page_rows, at + runner.t)
    kv.pool.block.zero_()
    if runner.attention == "fa4" and not runner.split_graphs:   # compiles at its first calls
        runner._between.warm_up(runner.t, cfg.head_dim, runner.page_rows, dev, dt)
    for pos in sorted({0, at}):
        warm_up(runner, kv, pos)
    if runner.split_graphs:
        return
    bodies = [runner._body] if runner.table else \
        [(lambda j: lambda: runner._segment(j))(j) for j in range(runner.num_full + 1)]
    pool = torch.cuda.graph_pool_handle()
    for body in bodies:
        graph = torch.cuda.CUDAGraph()
        # thread_local: a host in the same process (vLLM's worker) may launch work from its
        # own thread meanwhile; only this thread's unsafe calls break the capture
        with torch.no_grad(), torch.cuda.graph(graph, pool=pool,
                                               capture_error_mode="thread_local"):
            body()
        runner.graphs.append(graph)
