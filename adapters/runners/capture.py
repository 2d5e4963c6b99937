"""Warming up and capturing a chunk runner (runners.graphs.ChunkGraphs) before its first chunk:
its body run at positions of its own over KV rows of its own (Triton, FA4 and torch.compile
compile; cuBLAS makes its handles), then its CUDA graphs captured into one memory pool.
"""
from __future__ import annotations

import torch

from adapters.attention import fa4_plan


def new_side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A new CUDA stream on `device` for warm-ups (`side_stream`); None on other devices."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None


def side_stream(runner) -> torch.cuda.Stream:
    """The stream runner's warm-ups run on: its `side_stream`, made now if it has none (then
    kept there). One for all warm-ups, because cuBLAS keeps a workspace (32 MiB on an H200)
    for every stream it ran on, for the life of the process: a new stream at each of the 33
    warm-up positions of a 64-row runner held 32 of them, 1.07 GB (torch's pool has 32
    streams; docs/gpu-tests-states-2026-12-02.log: 1,084,832,768 bytes = 32 x 32 MiB and the
    11 MB the other runner held too)."""
    if runner.side_stream is None:
        runner.side_stream = new_side_stream(runner.model.device)
    return runner.side_stream


def warm_up(runner, kv, pos: int) -> None:
    """runner's body twice at pos over kv (a block_store.PagedKv), on its side stream
    (`side_stream`), then a sync; then, for a runner that returns no states, its slots let go
    of the output states (StateSlots.release)."""
    runner._stage([0] * runner.t, pos, kv)
    runner._pos, runner._kv = pos, kv
    twice_on_side(runner, runner._body)
    runner._kv = None
    runner.slots.release()


def twice_on_side(runner, body) -> None:
    """body() twice on the runner's side stream (`side_stream`; runner: anything with
    `side_stream` and `model`, a ChunkGraphs or a batch.BatchRunner), ordered after
    the current stream's work and before its next, then a sync of the model's device."""
    side = side_stream(runner)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize(runner.model.device)


def warm_positions(runner) -> list[int]:
    """Where the warm-up runs the body: 0, and with FA4 in the graph one position for each
    number of splits S > 0 the runner can meet (S * MIN_SPLIT_KEYS has S splits)."""
    if not runner.split_graphs:
        return [0]
    splits = runner._between.all_splits(runner.t, runner.model.device)
    return [s * fa4_plan.MIN_SPLIT_KEYS for s in splits]      # read now (tests lower it)


def capture(runner) -> None:
    """Warm up with KV rows of its own (`warm_positions`), then capture into runner.graphs: the
    whole body (table) or each segment into one memory pool (FA4 between graphs; replayed in
    the order captured, as a shared pool requires). With FA4 in the graph
    (runner.split_graphs) no capture here: its graphs name the pools, so they are made over
    the reader's pool by `capture_splits` or at the first chunk of each number of splits over
    a pool (runners.fa4_graph.SplitGraphs)."""
    from adapters.model.config import spec_for
    from block_store import contiguous_kv
    cfg, dev, dt = runner.model.cfg, runner.model.device, runner.model.dtype
    positions = warm_positions(runner)
    kv = contiguous_kv(spec_for(cfg, dev, dt), runner.page_rows, positions[-1] + runner.t)
    kv.pool.block.zero_()
    if runner.attention == "fa4" and not runner.split_graphs:   # compiles at its first calls
        runner._between.warm_up(runner.t, cfg.head_dim, runner.page_rows, dev, dt)
    for pos in positions:
        warm_up(runner, kv, pos)
    if runner.split_graphs:
        return
    bodies = [runner._body] if runner.table else \
        [(lambda j: lambda: runner._segment(j))(j) for j in range(runner.num_full + 1)]
    pool = torch.cuda.graph_pool_handle()
    runner.graphs.extend(graph_of(body, pool) for body in bodies)


def graph_of(body, mempool) -> torch.cuda.CUDAGraph:
    """body() captured into a new CUDA graph in the memory pool `mempool`
    (torch.cuda.graph_pool_handle). The capture syncs the device and empties torch's caches
    (torch.cuda.graph) and runs nothing. Raises what the capture raises."""
    graph = torch.cuda.CUDAGraph()
    # thread_local: a host in the same process (vLLM's worker) may launch work from its own
    # thread meanwhile; only this thread's unsafe calls break the capture
    with torch.no_grad(), torch.cuda.graph(graph, pool=mempool,
                                           capture_error_mode="thread_local"):
        body()
    return graph


def capture_splits(runner, pool) -> None:
    """With FA4 in the graph: capture now, over `pool` (a block_store KvPool, the reader's),
    the graph of every number of splits the runner can meet (4 took 0.203 s on the H200,
    docs/gpu-exact-graph-2026-12-02-b.log, captured at first chunks by the same code), and pin
    that pool (its graphs are kept). Captures run nothing, so the pool's pages are
    not touched. Call after the warm-up (`capture`). Later captures happen over other pools,
    over this one after it grows, and in runners made after the warm-up (runners.runners pins
    the pool in those), at their first chunks."""
    from block_store import PagedKv
    graphs = runner.split_graphs
    if graphs is None:
        return
    graphs.pin(pool)
    for s in runner._between.all_splits(runner.t, runner.model.device):
        runner._tables = graphs.tables_for(s)
        runner._kv = PagedKv(pool, [])
        try:
            graphs.ensure(s, pool, runner._body, runner.slots)
        finally:
            runner._kv = runner._tables = None
