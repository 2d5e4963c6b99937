"""Several questions over one session in one forward against one at a time, on CUDA (issue
36, item 3): the `questions` part of evals.bi_bench, run there (`python -m evals.bi_bench
--parts questions`, whose flags it reads; its JSON under "questions").

Per context and question bucket (--question-rows), B forks at the context's end over the
session's shared pages (a page of its own each, random states and ids):
- their last forwards one at a time through the bucket's runner against one forward of
  runners.batch (`one_at_a_time`, `one_forward`, `speedup`), `over_one` the batch's
  ms over one question's (the target: at most 1.5 at B = 4 and 100k), and `exact`: every
  fork's hidden rows from the batch equal to its runner's alone, bit for bit;
- beside it the same batch each other way of the check (batch.WAYS after the
  batch's own, or those named in --ways), each arm named by its parts in one call
  (OneCall.name, e.g. `attention+recurrences+norms`; `per_fork` for none), with `_over_one` and
  `_exact`;
- with --ceiling one forward of the B questions' rows as one sequence (`ceiling`,
  `over_ceiling`: what the per-fork work adds);
- with --profile the kernels of one question and of the largest batch at the largest context
  and smallest bucket (`profile`; with --ceiling the ceiling's too, `ceiling_profile`).
Then `down_bmm` per bucket and B: whether the down projection as one batched GEMM keeps each
fork's bits, and its ms against one GEMM a fork (on CUDA also through the split-K invariant
linear), inside CUDA graphs; `row_ops` per bucket: the (B, fork) pairs whose bits the question
runner's row-wise ops (the heads', the gates', the gated norm, the down projection) and the
GDN conv change over all rows.
"""
from __future__ import annotations

import functools
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from adapters.model import invariant
from evals.probes import blocks_differ
from evals.timing import device_ms


def scratch_pool(model, grid: int, num_shared: int, num_own: int, seed: int, spare: int = 0):
    """A bench's KV pool of grid-row pages filled with random rows (a device generator seeded
    with `seed`): (pool, shared: num_shared page indices, a context's, own: num_own page
    indices, one a fork, gdn: num_own random GDN state lists, per layer (conv [conv_dim, W]
    model dtype, recurrent [HV, K, V] fp32 times 0.1)); `spare` more pages left free."""
    from adapters import spec_for
    from block_store import KvPool
    dev, dt = model.device, model.dtype
    g = torch.Generator(device=dev).manual_seed(seed)
    spec = spec_for(model.cfg, dev, dt)
    pool = KvPool(spec, grid, num_shared + num_own + spare)
    pool.block.normal_(generator=g)
    shared = [pool.manager.allocate().index for _ in range(num_shared)]
    own = [pool.manager.allocate().index for _ in range(num_own)]
    gdn = [[(torch.randn(spec.conv_dim, spec.conv_width, device=dev, generator=g).to(dt),
             torch.randn(*spec.recurrent_shape, device=dev, generator=g) * 0.1)
            for _ in range(spec.num_gdn)] for _ in range(num_own)]
    return pool, shared, own, gdn


def questions_part(model, args) -> dict:
    """`questions` (module doc): per context, bucket and B the two arms' ms (CUDA events, the
    median of --repeats rounds after a warm-up round that also captures the graphs, the arms
    in turns each round) and the batch's bits against each fork alone."""
    from adapters.runners.batch import BatchRunner
    from adapters.runners.runners import Runners
    from block_store import PagedKv
    cfg, dev, grid = model.cfg, model.device, args.grid
    other_batches: dict = {}           # (rows, B, OneCall) -> a batch with less in one call
    runners, num = Runners(model, grid), max(args.batches)
    pool, shared, own, gdn = scratch_pool(model, grid, max(args.contexts) // grid, num, 3,
                                          spare=1)
    ids = torch.randint(0, cfg.vocab_size, (num, max(args.question_rows)),  # host lists,
                        generator=torch.Generator().manual_seed(3))         # as a reader's
    out = {}
    for rows in args.question_rows:
        alone = runners.for_rows(rows)
        alone.prepare(pool)
        for context in args.contexts:
            pages = shared[:context // grid]
            forks = [(ids[b, :rows].tolist(), context, PagedKv(pool, pages + [own[b]]), gdn[b])
                     for b in range(num)]
            one_ms = statistics.median(device_ms(lambda: alone.run(*forks[0]))[1]
                                       for _ in range(args.repeats + 1))   # one question
            for b in args.batches:
                batch = runners.question_batch(rows, b)
                each = lambda b=b: [alone.run(*f)[0] for f in forks[:b]]  # noqa: E731
                arms = {"one_at_a_time": each, "one_forward": each}
                if batch and batch.num_seqs == b:
                    arms["one_forward"] = lambda b=b, q=batch: q.run(forks[:b], context)
                    for calls in _other_ways(batch.calls, getattr(args, "ways", None)):
                        if (rows, b, calls) not in other_batches:
                            other_batches[(rows, b, calls)] = BatchRunner(
                                alone, runners.batch_slots(b), calls)
                        arms[calls.name] = lambda b=b, q=other_batches[(rows, b, calls)]: \
                            q.run(forks[:b], context)
                times = {arm: [] for arm in arms}
                for k in range(args.repeats + 1):      # round 0: warm-up and captures
                    for arm, fn in arms.items():       # the arms in turns each round
                        ms = device_ms(fn)[1]
                        if k:
                            times[arm].append(ms)
                row = {arm: round(statistics.median(ts), 3) for arm, ts in times.items()}
                row["speedup"] = round(row["one_at_a_time"] / row["one_forward"], 3)
                row["over_one"] = round(row["one_forward"] / one_ms, 3)
                alone_rows = each()
                row["exact"] = all(torch.equal(x, y) for x, y in
                                   zip(alone_rows, arms["one_forward"]()))
                for name in [a for a in arms if a not in ("one_at_a_time", "one_forward")]:
                    row[f"{name}_over_one"] = round(row[name] / one_ms, 3)
                    row[f"{name}_exact"] = all(torch.equal(x, y) for x, y in zip(
                        alone_rows, arms[name]()))
                batched = batch is not None and batch.num_seqs == b
                profiled = getattr(args, "profile", False) and (b == 1 or (
                    batched and b == max(args.batches))) and \
                    context == max(args.contexts) and rows == min(args.question_rows)
                if getattr(args, "ceiling", False) and b > 1:
                    row.update(ceiling_forward(model, alone, ids[:b, :rows], context,
                                                 PagedKv(pool, pages + own), gdn[0],
                                                 args.repeats, row["one_forward"], profiled))
                out[f"{context}x{rows}x{b}"] = row
                print(f"questions {context} rows {rows} B {b} {row}", file=sys.stderr,
                      flush=True)
                if profiled:
                    target, run = ((batch, lambda b=b, q=batch: q.run(forks[:b], context))
                                   if batched else (alone, lambda: alone.run(*forks[0])))
                    try:                       # the rows above kept whatever the profiler does
                        row["profile"] = forward_profile(target, run)
                    except Exception as e:     # noqa: BLE001 (a bench: said, not fatal)
                        row["profile_error"] = f"{type(e).__name__}: {e}"
    out["down_bmm"] = {f"{rows}x{b}": _down_bmm(model, rows, b, args.repeats)
                       for rows in args.question_rows for b in args.batches if b > 1}
    out["row_ops"] = {str(rows): _row_ops(model, runners.for_rows(rows).ops, rows,
                                          [b for b in args.batches if b > 1])
                      for rows in args.question_rows}
    if getattr(args, "q_copies", False) and dev.type == "cuda":
        out["q_copies"] = {f"{context}x{rows}x{b}": _q_copies(
            model, pool, shared[:context // grid], own, context, rows, b, args.repeats)
            for context in args.contexts for rows in args.question_rows
            for b in args.batches}
    out["captures"] = runners.captures()
    return out


def _q_copies(model, pool, pages: list, own: list, context: int, rows: int, num_seqs: int,
              repeats: int) -> dict:
    """`--q-copies`: FA4's split calls of B forks of `rows` rows at `context` (one
    full-attention layer's, the question runner's split count S) three ways, each fork's
    outputs and log-sum-exps against the first's bit for bit (`exact`) and each way's ms for
    the model's full-attention layers in one CUDA graph: `copies` q copied S times, a batch
    of S * B, split-major (fa4_graph.attend_many before the shared splits), `broadcast` the
    same as B calls of S each with q broadcast (stride 0: no copy; B = 1: one call, and
    `copies` is then a stride-0 view too), `shared` one batch of S over all forks' rows
    through fork 0's tables with q broadcast (each split's keys read once, no copy), as
    attend_many runs them now."""
    from adapters.attention import fa4
    from adapters.runners import fa4_graph
    cfg, dev, dt = model.cfg, model.device, model.dtype
    h, d, t, n = cfg.num_attention_heads, cfg.head_dim, rows, num_seqs
    s = fa4.FA4Attention(h, cfg.num_key_value_heads).num_splits(context, t, dev)
    if s == 0:
        return {"splits": 0}
    hkv, layers = cfg.num_key_value_heads, sum(1 for x in model.layers if hasattr(x, "self_attn"))
    k_pool, v_pool = pool.layer(0)
    k = k_pool.view(-1, fa4_graph.SUB_PAGE, hkv, d)
    v = v_pool.view(-1, fa4_graph.SUB_PAGE, hkv, d)
    tabs = [fa4_graph.tables_ref(s, context, t, pages + [own[b]], pool.page_rows)
            for b in range(n)]
    split = torch.stack([x["split"] for x in tabs], 1).reshape(s * n, -1).to(
        device=dev, dtype=torch.int32)
    split_len = torch.stack([x["split_len"] for x in tabs], 1).reshape(s * n).to(
        device=dev, dtype=torch.int32)
    g = torch.Generator(device=dev).manual_seed(rows + n)
    q = torch.randn(n, t, h, d, device=dev, generator=g).to(dt)
    o = torch.empty(s, n, t, h, d, device=dev, dtype=dt)
    lse = torch.empty(s, n, h, t, device=dev, dtype=torch.float32)
    o_fork = torch.empty(n, s, t, h, d, device=dev, dtype=dt)        # broadcast's, per fork
    lse_fork = torch.empty(n, s, h, t, device=dev, dtype=torch.float32)
    o_shared = torch.empty(s, n * t, h, d, device=dev, dtype=dt)
    lse_shared = torch.empty(s, h, n * t, device=dev, dtype=torch.float32)
    fwd, call = fa4.forward(), dict(causal=False, tile_mn=fa4_graph.TILE_MN)

    def copies():
        qs = q[None].expand(s, n, t, h, d).reshape(s * n, t, h, d)
        fwd(qs, k, v, page_table=split, seqused_k=split_len, out=o.view(s * n, t, h, d),
            lse=lse.view(s * n, h, t), **call)

    lens = [split_len[b::n].contiguous() for b in range(n)]      # fork b's key counts

    def broadcast():
        for b in range(n):
            fwd(q[b][None].expand(s, t, h, d), k, v, page_table=split[b::n],
                seqused_k=lens[b], out=o_fork[b], lse=lse_fork[b], **call)

    def shared():
        fwd(q.view(1, n * t, h, d).expand(s, n * t, h, d), k, v, page_table=split[::n],
            seqused_k=lens[0], out=o_shared, lse=lse_shared, **call)

    copies()
    ref_o, ref_lse = o.clone(), lse.clone()
    out = {"splits": s}
    for name, fn in (("copies", copies), ("broadcast", broadcast), ("shared", shared)):
        try:
            fn()
            if name == "shared":
                same = torch.equal(o_shared.view(s, n, t, h, d), ref_o) and torch.equal(
                    lse_shared.view(s, h, n, t).permute(0, 2, 1, 3), ref_lse)
            elif name == "broadcast":
                same = torch.equal(o_fork.transpose(0, 1), ref_o) and torch.equal(
                    lse_fork.transpose(0, 1), ref_lse)
            else:
                same = torch.equal(o, ref_o) and torch.equal(lse, ref_lse)
            ms = _graph_ms(lambda fn=fn: [fn() for _ in range(layers)], repeats)
            out[name] = {"exact": same, "ms": round(ms, 3)}
        except Exception as e:       # noqa: BLE001 (a bench: said, not fatal)
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(f"q_copies {context} rows {rows} B {n} {out}", file=sys.stderr, flush=True)
    return out


def _down_bmm(model, rows: int, num_seqs: int, repeats: int) -> dict:
    """Whether the MLP's down projection of B forks' rows as one batched GEMM (torch.bmm over
    [B, rows, I], the weight broadcast: cuBLAS's strided batched GEMM) gives each fork the
    bits F.linear gives its rows alone (`exact`), and both arms' ms for one call a layer of
    the model (`bmm_ms`, `per_fork_ms`: one linear a fork; `one_ms`: one fork's rows alone;
    on random SwiGLU-sized rows); on CUDA also the
    invariant split-K linear (model.invariant.linear_splitk, `splitk4`, `splitk8`,
    `splitk16` with its default tile, `splitk4_64x64x64`, `splitk8_64x64x64` with 64-column
    tiles: every fork's rows in one call against each alone through it, `exact`, and `ms`,
    `one_ms`). Every ms: the median device time of one call a layer of the model, all in
    one CUDA graph (_graph_ms)."""
    cfg, dev, dt = model.cfg, model.device, model.dtype
    g = torch.Generator(device=dev).manual_seed(rows + num_seqs)
    act = torch.randn(num_seqs * rows, cfg.intermediate_size, device=dev, dtype=dt,
                      generator=g)
    w = model.layers[0].mlp.down_proj.weight
    wb = w.t().expand(num_seqs, -1, -1)
    per_fork = lambda: torch.cat([torch.nn.functional.linear(  # noqa: E731
        act[b * rows:(b + 1) * rows], w) for b in range(num_seqs)])
    bmm = lambda: torch.bmm(act.view(num_seqs, rows, -1), wb).view(num_seqs * rows, -1)  # noqa
    exact = torch.equal(per_fork(), bmm())
    n = len(model.layers)

    def ms(fn) -> float:                       # n calls (a layer each) in one CUDA graph
        return _graph_ms(lambda: [fn() for _ in range(n)], repeats)
    out = {"exact": exact, "bmm_ms": round(ms(bmm), 3), "per_fork_ms": round(ms(per_fork), 3),
           "one_ms": round(ms(lambda: F.linear(act[:rows], w)), 3)}
    if act.is_cuda:             # the invariant split-K linear, over all rows and for one fork
        for tile, splits in [(invariant.TILE, s) for s in (4, 8, 16)] + [
                (invariant.Tile(64, 64, 64), s) for s in (4, 8)]:
            fn = functools.partial(invariant.linear_splitk, w=w, splits=splits, tile=tile)
            name = f"splitk{splits}" + ("" if tile == invariant.TILE else
                                        f"_{tile.block_m}x{tile.block_n}x{tile.block_k}")
            out[name] = {
                "exact": all(torch.equal(fn(act)[b * rows:(b + 1) * rows],
                                         fn(act[b * rows:(b + 1) * rows]))
                             for b in range(num_seqs)),
                "ms": round(ms(lambda: fn(act)), 3),
                "one_ms": round(ms(lambda: fn(act[:rows])), 3)}
    return out


def _graph_ms(fn, repeats: int) -> float:
    """Median ms of fn() replayed as one CUDA graph (device time, no launch gaps of the
    host: Triton's launches cost the host tens of us each), after one eager warm-up call and
    one replay; eagerly by the clock where there is no CUDA (a smoke run)."""
    fn()
    if not torch.cuda.is_available():
        return statistics.median(device_ms(fn)[1] for _ in range(repeats))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    return statistics.median(device_ms(graph.replay)[1] for _ in range(repeats))


def _row_ops(model, op, rows: int, batches: list[int]) -> dict:
    """blocks_differ of the row-wise ops BatchRunner's `rows` and `conv` parts run over all B
    * rows rows, each with the question runner's op set `op` (on CUDA ops.row_invariant_ops:
    model.rowwise's kernels, model.invariant's split-K down projection) on random inputs of the
    model's shapes: `norm_rope` (the q norm and RoPE, the forks' cos, sin repeated),
    `gdn_gates`, `gated_rms_norm`, `down` (the MLP's down projection, Ops.down_proj), and `conv`
    (KernelSet.convs over [B, rows] with each block's own state against KernelSet.conv per
    block): the (B, block) pairs that get other bits than alone."""
    cfg, dev, dt = model.cfg, model.device, model.dtype
    g = torch.Generator(device=dev).manual_seed(rows)
    most = max(batches, default=1)
    rnd = lambda *shape: torch.randn(*shape, device=dev, generator=g).to(dt)  # noqa: E731
    attn = next(x.self_attn for x in model.layers if hasattr(x, "self_attn"))
    gdn = model.layers[cfg.linear_layers[0]].linear_attn
    h, d, hv = cfg.num_attention_heads, cfg.head_dim, cfg.linear_num_value_heads
    cos, sin = (rnd(rows, cfg.rotary_dim).repeat(most, 1) for _ in range(2))
    # the layouts the batch feeds them: q every 2 D of the fused projection's rows (its gate
    # between), the conv output contiguous, b and a column slices of one fused output
    q = rnd(most * rows, h, 2 * d)[..., :d]
    out = {"norm_rope": blocks_differ(
        lambda x, c, s_: op.norm_rope(x, attn.q_norm.weight, attn.q_norm.eps, c, s_),
        [q, cos, sin], rows, batches)}
    ba = rnd(most * rows, 2 * hv + 1)
    out["gdn_gates"] = blocks_differ(
        lambda m, b, a: op.gdn_gates(m, b, a, gdn.A_log, gdn.dt_bias,
                                     cfg.linear_num_key_heads, cfg.linear_key_head_dim, hv,
                                     cfg.linear_value_head_dim),
        [rnd(most * rows, cfg.conv_dim), ba[:, :hv], ba[:, hv:2 * hv]], rows, batches)
    x, states = rnd(most, rows, cfg.conv_dim), rnd(most, cfg.conv_dim, cfg.linear_conv_kernel_dim)
    weight, kernels = gdn.conv1d.weight[:, 0, :], model.kernels
    vd = cfg.linear_value_head_dim
    z = rnd(most * rows, hv * vd + 8)[:, 8:].reshape(most * rows, hv, vd)    # a column slice
    out["gated_rms_norm"] = blocks_differ(
        lambda o, z_: op.gated_rms_norm(o, z_, gdn.norm.weight, gdn.norm.eps),
        [rnd(most * rows, hv, vd), z], rows, batches)
    out["down"] = blocks_differ(
        lambda a: op.down_proj(a, model.layers[0].mlp.down_proj.weight),
        [rnd(most * rows, cfg.intermediate_size)], rows, batches)
    out["conv"] = []
    for n in batches:
        y, s_ = kernels.convs(x[:n], weight, states[:n])
        for b in range(n):
            y1, s1 = kernels.conv(x[b], weight, states[b])
            if not (torch.equal(y[b], y1) and torch.equal(s_[b], s1)):
                out["conv"].append([n, b])
    return out


def _other_ways(calls, names: list[str] | None) -> list:
    """The ways timed beside a batch's own (`calls`): those after it in the check's order
    (OneCall.fallback, FA4 ways only where `calls` has FA4 in one call), or of them those
    named (OneCall.name). Raises ValueError for a name of no such way."""
    ways, way = [], calls.fallback(calls.attention)
    while way is not None:
        ways.append(way)
        way = way.fallback(calls.attention)
    if names is None:
        return ways
    by_name = {w.name: w for w in ways}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"--ways: no way {unknown} after {calls.name}; ways: {list(by_name)}")
    return [by_name[n] for n in names]


def forward_profile(target, run, iters: int = 5, top: int = 30) -> dict:
    """`--profile`: run() (a forward of `target`, a BatchRunner or for B = 1 the question or
    chunk runner alone; also bi_bench's `chunks`) with target's graphs off (eagerly: the same
    kernels its graph replays, one launch each) under torch.profiler, iters times after one
    warm-up: the `top` kernels by device time, each {calls, us} per forward, the device time
    in all (us per forward) and the number of kernels a forward (launches in its graph)."""
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    graphs = target.use_graphs
    target.use_graphs = False                  # eagerly: each kernel its own launch
    try:
        run()
        sync()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) \
                as prof:
            for _ in range(iters):
                run()
            sync()
    finally:
        target.use_graphs = graphs

    def device_us(evt) -> float:                # the CPU's ops' own time off CUDA (a smoke run)
        if not cuda:
            return evt.self_cpu_time_total
        if hasattr(evt, "self_device_time_total"):            # torch >= 2.4 (2.11 on the GPU)
            return evt.self_device_time_total
        return evt.self_cuda_time_total
    kernels = sorted((e for e in prof.key_averages() if device_us(e) > 0), key=device_us,
                     reverse=True)
    out = {"total_us": round(sum(device_us(e) for e in kernels) / iters, 1),
           "num_kernels": sum(e.count for e in kernels) // iters, "kernels": {}}
    for e in kernels[:top]:
        out["kernels"][e.key[:120]] = {"calls": e.count // iters,
                                       "us": round(device_us(e) / iters, 1)}
    print(f"profile {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def ceiling_forward(model, alone, ids, context: int, kv, gdn, repeats: int,
                      batch_ms: float, profile: bool = False) -> dict:
    """`--ceiling`: the ms of one forward of a batch's B blocks of rows as one sequence (a
    ChunkGraphs of B x t rows over kv's pages from `context`, ids [B, t]: every layer over all
    rows, one attention and one recurrence; the B questions' or sessions' own work left out),
    the median of `repeats` after a warm-up, and the batch's ms over it (what its per-fork or
    per-session attention, recurrences, norms and down projections add); with profile, its
    kernels too (`ceiling_profile`, as forward_profile gives them: what the batch runs that it
    does not). `alone` is the runner of one block (the question or chunk runner) whose ops,
    projections and side stream the ceiling shares; kv must hold B x t rows from `context`."""
    from adapters.runners import graphs
    runner = graphs.ChunkGraphs(model, ids.numel(), page_rows=alone.page_rows,
                                op_set=alone.ops, proj=alone.proj, return_states=False,
                                side_stream=alone.side_stream)
    flat = ids.flatten().tolist()
    times = [device_ms(lambda: runner.run(flat, context, kv, gdn))[1]
             for _ in range(repeats + 1)]
    ms = statistics.median(times[1:])
    out = {"ceiling": round(ms, 3), "over_ceiling": round(batch_ms / ms, 3)}
    if profile:
        out["ceiling_profile"] = forward_profile(runner,
                                                   lambda: runner.run(flat, context, kv, gdn))
    return out
