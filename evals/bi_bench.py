"""The batched read on CUDA (issue 36, item 2), on the H200, in one process:

- `probe`: which ops of the batched forward give a row the same bits whatever else is in the
  GEMM or reduction, as they are on this device: F.linear (cuBLAS) over the first M rows of
  one input against the same rows of a 4,096-row GEMM, per projection shape of the model; the
  invariant linear (model.invariant) the same way; RMSNorm (the model's), SiLU, sigmoid over
  M = n x grid rows against grid rows alone; fla's chunked GDN rule per sequence (twice on the
  same input) and varlen (two sequences packed by cu_seqlens against each alone). Per op the
  row counts whose rows differ (empty: invariant).
- `speed`: the invariant linear against F.linear at M = 512, 1,024, 2,048, 4,096 on each
  projection shape, per tile asked for (--tiles; a tile's bits are its own), CUDA events,
  warm-up, the median of --iters.
- `graphs`: what a batched read inside CUDA graphs could keep and gain, from what
  exists: per 512-row block of a B x 512-row input (B = 2, 4, 8), whether the graph path's
  GEMMs (cuBLAS over the fused projection weights, model.fuse, and the unfused output
  projections; also per 128- and 64-row block, the questions' small buckets) and its compiled
  small ops (ops.fused_ops) give each block the bits it gets alone (`blocks_differ`: the
  (B, block) pairs that do not); and the ceiling of its speed: one
  ChunkGraphs forward of B x 512 rows of one sequence at each context (every layer over all
  rows, FA4 over the pages) against B forwards of 512 rows (`ceiling`; a batched read over B
  sessions adds B attentions and GDN recurrences in place of one).
- `questions`: several questions over one session in one forward (issue 36, item 3):
  evals.question_bench, run as a part of this bench.
- `chunks`: the batched read inside CUDA graphs (Runners.chunk_batch, item 2): B = 1, 2, 4, 8
  sessions' grid chunks at each context in one forward against the chunk runner one chunk at
  a time, ms, ids/s, and each chunk's hidden rows, KV rows and GDN states against alone, bit
  for bit (`exact`); with --chunk-ops compiled,rowwise the chunk runner's compiled ops and its
  row-invariant ones (Runners(row_invariant=True)) side by side.
- `read`: chunks/s and ids/s for B = 1, 2, 4, 8 sessions at each context: today's reader
  (make_adapter's default on CUDA: the graph runners, cuBLAS, one chunk at a time) and the
  'eager+bi' path (EagerAdapter(invariant=True)) one at a time and in one forward
  (Reader.read_batch), the arms in turns each round; every session's committed state on the
  batched reader equal to the same session's on the alone 'eager+bi' reader, bit for bit
  ("exact"; the alone reader read its context one chunk at a time, the batched one in
  batches). `speedup` is one-at-a-time over batched on 'eager+bi'; `over_today` today's one at
  a time over batched.

    python -m evals.bi_bench [--model random:qwen3.5-0.8b] [--grid 512]
        [--parts probe,speed,graphs,questions,chunks,read] [--contexts 16384,65536]
        [--batches 1,2,4,8] [--question-rows 64,128] [--ways NAME,...] [--ceiling] [--profile]
        [--chunk-ways NAME,...] [--chunk-ops compiled,rowwise] [--repeats 3] [--iters 20]
        [--tiles 64x128x64x4x3,...] [--arms today,bi] [--device cuda|cpu]
        [--out FILE]

The last line printed is one JSON object (GPU, dtype, versions, commit, date); nothing here
asserts a speed. Figures come from CUDA only; `--device cpu` (with TRITON_INTERPRET=1 and a
tiny model) runs the code paths as a smoke test.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from adapters.model import invariant
from evals import question_bench
from evals.batch_bench import git_commit, session_ids
from evals.probes import blocks_differ
from evals.timing import device_ms

ROW_COUNTS = (1, 3, 17, 64, 511, 512, 1024, 2048, 4096)


def projection_shapes(model) -> dict[str, torch.Tensor]:
    """One weight [N, K] per projection shape of the model, named by its first module."""
    out: dict[tuple, tuple[str, torch.Tensor]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            out.setdefault(tuple(mod.weight.shape), (name.split(".")[-1], mod.weight))
    return {f"{n} {s[0]}x{s[1]}": w for s, (n, w) in out.items()}


def rows_differ(fn, x: torch.Tensor, counts) -> list[int]:
    """The row counts M for which fn(x[:M]) differs from fn(x)[:M] (x: max(counts) rows)."""
    big = fn(x)
    return [m for m in counts if not torch.equal(fn(x[:m]), big[:m])]


def gdn_probe(model, grid: int) -> dict:
    """fla's chunked rule: per sequence deterministic, and varlen packing against alone."""
    cfg, dev = model.cfg, model.device
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    kd, vd = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    g = torch.Generator(device=dev).manual_seed(0)

    def seq():
        q = F.normalize(torch.randn(grid, hk, kd, device=dev, generator=g), dim=-1)
        k = F.normalize(torch.randn(grid, hk, kd, device=dev, generator=g), dim=-1)
        v = torch.randn(grid, hv, vd, device=dev, generator=g)
        gate = -torch.rand(grid, hv, device=dev, generator=g) * 0.1
        beta = torch.rand(grid, hv, device=dev, generator=g)
        state = torch.randn(hv, kd, vd, device=dev, generator=g) * 0.1
        return (q.to(model.dtype), k.to(model.dtype), v.to(model.dtype), gate,
                beta.to(model.dtype), state)

    a, b = seq(), seq()
    o1, s1 = model.kernels.gdn(*a)
    o2, s2 = model.kernels.gdn(*a)
    out = {"per_sequence_same_bits": bool(torch.equal(o1, o2) and torch.equal(s1, s2))}
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        ob, sb = model.kernels.gdn(*b)
        packed = [torch.cat([x, y])[None] for x, y in zip(a[:5], b[:5])]
        cu = torch.tensor([0, grid, 2 * grid], device=dev, dtype=torch.int32)
        o, s = chunk_gated_delta_rule(*packed[:3], g=packed[3].float(), beta=packed[4],
                                      initial_state=torch.stack([a[5], b[5]]).float(),
                                      output_final_state=True, cu_seqlens=cu,
                                      use_qk_l2norm_in_kernel=False)
        out["varlen_same_bits_as_alone"] = bool(
            torch.equal(o[0, :grid], o1) and torch.equal(o[0, grid:], ob)
            and torch.equal(s[0], s1) and torch.equal(s[1], sb))
    except Exception as e:                          # reported, not fatal: a probe
        out["varlen_error"] = f"{type(e).__name__}: {e}"[:300]
    return out


def probe_part(model, grid: int) -> dict:
    """Per op, the row counts whose rows differ (module doc)."""
    dev, dt = model.device, model.dtype
    g = torch.Generator(device=dev).manual_seed(0)
    linears = {}
    for name, w in projection_shapes(model).items():
        x = torch.randn(max(ROW_COUNTS), w.shape[1], device=dev, generator=g).to(dt)
        linears[name] = {"cublas": rows_differ(lambda t, w=w: F.linear(t, w), x, ROW_COUNTS),
                         "invariant": rows_differ(lambda t, w=w: invariant.linear(t, w), x,
                                                  ROW_COUNTS)}
    counts = [n * grid for n in (1, 2, 4, 8, 16)]
    width, inter = model.cfg.hidden_size, model.cfg.intermediate_size
    h = torch.randn(max(counts), width, device=dev, generator=g).to(dt)
    u = torch.randn(max(counts), inter, device=dev, generator=g).to(dt)
    rowwise = {"rms_norm": rows_differ(model.norm, h, counts),
               "silu": rows_differ(F.silu, u, counts),
               "sigmoid": rows_differ(torch.sigmoid, u, counts),
               "residual_add": rows_differ(lambda t: t + t * 0.5, h, counts)}
    return {"linear_rows_differ_at_m": linears, "rowwise_rows_differ_at_m": rowwise,
            "gdn_fla": gdn_probe(model, grid)}



def graphs_part(model, args) -> dict:
    """`graphs` (module doc): blocks_differ per GEMM weight and compiled op, then the ceiling's
    ms per context and B (CUDA events, the median of --repeats after a warm-up round)."""
    from adapters import spec_for
    from adapters.runners import graphs
    from block_store import KvPool, PagedKv
    cfg, dev, dt, grid = model.cfg, model.device, model.dtype, args.grid
    batches = [b for b in args.batches if b > 1]
    one = graphs.ChunkGraphs(model, grid, page_rows=grid, keep_states=True)
    g = torch.Generator(device=dev).manual_seed(2)
    rows = grid * max(args.batches)
    rnd = lambda *shape: torch.randn(rows, *shape, device=dev, generator=g).to(dt)  # noqa: E731
    weights = {}
    if one.proj is not None:
        for kind in ("gdn_in", "attn_in", "mlp_in"):
            fused = getattr(one.proj, kind)
            if fused:
                w = next(iter(fused.values()))
                weights[f"fused {kind} {w.shape[0]}x{w.shape[1]}"] = w
    weights.update(projection_shapes(model))
    # blocks of a grid chunk (a batched read) and of the small question buckets (questions
    # batched over one session, runners.Runners.SMALL_BUCKET_ROWS)
    out = {f"gemm_blocks_differ_{block}": {
        n: blocks_differ(lambda x, w=w: F.linear(x, w), [rnd(w.shape[1])], block, batches)
        for n, w in weights.items()} for block in (grid, 128, 64)}
    op, eps, hid = one.ops, cfg.rms_norm_eps, cfg.hidden_size
    w_h = model.layers[0].input_layernorm.weight
    hv, vd = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    w_v = next(m.norm.weight for m in (x.linear_attn for x in model.layers
                                       if hasattr(x, "linear_attn")))
    inter, hd = cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim
    out["ops_blocks_differ"] = {
        "rms_norm": blocks_differ(lambda x: op.rms_norm(x, w_h, eps), [rnd(hid)], grid,
                                  batches),
        "add_rms_norm": blocks_differ(lambda x, h: op.add_rms_norm(x, h, w_h, eps),
                                      [rnd(hid), rnd(hid)], grid, batches),
        "gated_rms_norm": blocks_differ(lambda x, z: op.gated_rms_norm(x, z, w_v, eps),
                                        [rnd(hv, vd), rnd(hv, vd)], grid, batches),
        "swiglu": blocks_differ(op.swiglu, [rnd(inter), rnd(inter)], grid, batches),
        "sigmoid_gate": blocks_differ(op.sigmoid_gate, [rnd(hd), rnd(hd)], grid, batches)}
    print(f"graphs blocks {json.dumps(out)}", file=sys.stderr, flush=True)
    # the ceiling: one sequence's pages, random rows (timing only)
    spec = spec_for(cfg, dev, dt)
    num_pages = (max(args.contexts) + rows) // grid + 1
    pool = KvPool(spec, grid, num_pages)
    pool.block.normal_(generator=g)
    kv = PagedKv(pool, [pool.manager.allocate().index for _ in range(num_pages)])
    gdn = [(torch.randn(spec.conv_dim, spec.conv_width, device=dev, generator=g).to(dt),
            torch.randn(*spec.recurrent_shape, device=dev, generator=g) * 0.1)
           for _ in range(spec.num_gdn)]
    ids = torch.randint(0, cfg.vocab_size, (rows,), device=dev, generator=g)
    runners = {1: one}
    for b in batches:
        runners[b] = graphs.ChunkGraphs(model, grid * b, page_rows=grid, op_set=one.ops,
                                        proj=one.proj, keep_states=True,
                                        side_stream=one.side_stream)
    out["ceiling"] = {}
    for context in args.contexts:
        for b in args.batches:
            times = {"one_at_a_time": [], "one_forward": []}
            for k in range(args.repeats + 1):           # round 0: warm-up (and captures)
                ms_each = device_ms(lambda: [one.run(ids[:grid], context, kv, gdn)
                                             for _ in range(b)])[1]
                ms_one = device_ms(lambda: runners[b].run(ids[:grid * b], context, kv, gdn))[1]
                if k:
                    times["one_at_a_time"].append(ms_each)
                    times["one_forward"].append(ms_one)
            row = {arm: round(statistics.median(ts), 2) for arm, ts in times.items()}
            row["speedup"] = round(row["one_at_a_time"] / row["one_forward"], 3)
            out["ceiling"][f"{context}x{b}"] = row
            print(f"graphs ceiling {context}x{b} {row}", file=sys.stderr, flush=True)
    return out                    # its runners and pool go with this frame


def chunks_part(model, args) -> dict:
    """`chunks` (module doc): per context and B, B sessions' grid chunks through
    Runners.chunk_batch in one forward against the chunk runner one chunk at a time (CUDA
    events, the median of --repeats rounds after a warm-up round that also captures the
    graphs, the arms in turns), chunks/s and ids/s of each, and every chunk's hidden rows, KV
    rows and GDN states against its own alone, bit for bit (`exact`).

    --chunk-ops: the chunk runner's op sets, side by side in one run ('compiled',
    torch.compile's ops, and 'rowwise', Runners(row_invariant=True); default: the one
    Runners picks on this device, runners.row_invariant_default), recorded as the part's
    `chunk_ops`: the first's arms are `one_at_a_time` and `one_forward`, another's
    `<ops>_one_at_a_time`, ... (`<ops>_exact`, `<ops>_speedup`, `<ops>_ids_per_s`, and
    `<ops>_over_<first>`: its chunk alone over the first's). --chunk-ways: beside the first
    op set's batch way (Runners.chunk_way) those named, each timed and checked the same way
    (`<name>`, `<name>_exact`); --profile: one chunk's forward and the largest batch's at
    the smallest context under torch.profiler (question_bench.forward_profile: eagerly,
    kernels by device time; `profile`, `<ops>_profile`); --ceiling: the B chunks' rows as
    one sequence in one forward through the first op set's chunk runner
    (question_bench.ceiling_forward: `ceiling`, `over_ceiling`, and with --profile its
    kernels)."""
    from adapters.runners.batch import CHUNK_WAYS
    from adapters.runners.runners import row_invariant_default
    from block_store import PagedKv
    cfg, grid, num = model.cfg, args.grid, max(args.batches)
    op_sets = getattr(args, "chunk_ops", None) or \
        ["rowwise" if row_invariant_default(model) else "compiled"]
    if set(op_sets) - {"compiled", "rowwise"} or len(set(op_sets)) < len(op_sets):
        raise ValueError(f"--chunk-ops: 'compiled' and 'rowwise', each once; got {op_sets}")
    sets = {name: _chunk_set(model, args, name, op_sets[0], CHUNK_WAYS) for name in op_sets}
    first = op_sets[0]
    pool, context_pages, own, gdn = question_bench.scratch_pool(
        model, grid, max(args.contexts) // grid, num, 5)
    ids = torch.randint(0, cfg.vocab_size, (num, grid), generator=torch.Generator()
                        .manual_seed(5))
    out = {}
    for context in args.contexts:
        # each session over the context's pages (the attention reads them per session) and
        # a page of its own for its chunk's rows
        items = [(ids[b].tolist(), context, PagedKv(pool, context_pages[:context // grid]
                                                    + [own[b]]), gdn[b]) for b in range(num)]
        for b in args.batches:
            arms, batches = {}, {}
            for name, chunk_set in sets.items():
                prefix = "" if name == first else f"{name}_"
                arms.update(_chunk_arms(chunk_set, items[:b], b, prefix))
                batches[name] = chunk_set["runners"].chunk_batch(b) if b > 1 else None
            times = {arm: [] for arm in arms}
            for k in range(args.repeats + 1):
                for arm, fn in arms.items():
                    ms = device_ms(fn)[1]
                    if k:
                        times[arm].append(ms)
            row = {arm: round(statistics.median(ts), 3) for arm, ts in times.items()}
            profile = getattr(args, "profile", False) and context == min(args.contexts) \
                and b in (1, max(args.batches))         # where the time goes, eagerly
            for name, chunk_set in sets.items():
                prefix = "" if name == first else f"{name}_"
                _chunk_row(row, prefix, b, grid)
                if name != first:
                    row[f"{prefix}over_{first}"] = round(
                        row[f"{prefix}one_at_a_time"] / row["one_at_a_time"], 3)
                batch, chunk = batches[name], chunk_set["runners"].chunk
                if profile:
                    row[f"{prefix}profile"] = question_bench.forward_profile(
                        batch if batch is not None else chunk, arms[f"{prefix}one_forward"])
                for arm in [f"{prefix}one_forward", *chunk_set["ways"]] if batch else []:
                    key = f"{prefix}exact" if arm == f"{prefix}one_forward" else f"{arm}_exact"
                    row[key] = _chunks_exact(arms[arm](), items[:b], own, pool, chunk)
                    if arm in chunk_set["ways"]:
                        row[f"{arm}_speedup"] = round(row["one_at_a_time"] / row[arm], 3)
            if getattr(args, "ceiling", False) and batches[first] is not None:
                # the b chunks' rows as one sequence over the context's pages and b own pages
                kv = PagedKv(pool, context_pages[:context // grid] + own[:b])
                row.update(question_bench.ceiling_forward(
                    model, sets[first]["runners"].chunk, ids[:b], context, kv, gdn[0],
                    args.repeats, row["one_forward"], profile=profile))
            out[f"{context}x{b}"] = row
            print(f"chunks {context} B {b} {row}", file=sys.stderr, flush=True)
    captures = {name: chunk_set["runners"].captures() for name, chunk_set in sets.items()}
    out["captures"] = captures if len(sets) > 1 else captures[first]
    out["chunk_ops"] = op_sets
    return out


def _chunk_set(model, args, name: str, first: str, ways) -> dict:
    """One op set's Runners and, for the first op set (`first`), the --chunk-ways named (name
    -> OneCall); ValueError for a way that is none of `ways` or is the batch's own."""
    from adapters.runners.runners import Runners
    row_invariant = name == "rowwise"
    runners = Runners(model, args.grid, row_invariant=row_invariant)
    by_name = {w.name: w for w in ways if w != runners.chunk_way()}
    names = (getattr(args, "chunk_ways", None) or []) if name == first else []
    if set(names) - set(by_name):
        raise ValueError(f"--chunk-ways: no way {sorted(set(names) - set(by_name))} beside "
                         f"the batch's own; ways: {list(by_name)}")
    return {"runners": runners, "ways": {n: by_name[n] for n in names}, "batches": {}}


def _chunk_arms(chunk_set: dict, items, b: int, prefix: str) -> dict:
    """The timed arms of one op set at B = b: one at a time, in one forward (the batch's own
    way; one at a time for b = 1) and each --chunk-ways way (its own BatchRunner, made once
    per (B, way))."""
    from adapters.runners.batch import BatchRunner
    runners = chunk_set["runners"]
    batch = runners.chunk_batch(b) if b > 1 else None
    each = lambda: [runners.chunk.run(*item) for item in items]      # noqa: E731
    arms = {f"{prefix}one_at_a_time": each,
            f"{prefix}one_forward": (lambda: batch.read(items)) if batch else each}
    for name, way in chunk_set["ways"].items() if batch is not None else []:
        if (b, name) not in chunk_set["batches"]:
            chunk_set["batches"][(b, name)] = BatchRunner(
                runners.chunk, runners.chunk_slots(b), way, one_position=False)
        arms[name] = lambda q=chunk_set["batches"][(b, name)]: q.read(items)
    return arms


def _chunk_row(row: dict, prefix: str, b: int, grid: int) -> None:
    """One op set's speedup and ids/s from its arms' ms in `row` (in place)."""
    alone, batch = row[f"{prefix}one_at_a_time"], row[f"{prefix}one_forward"]
    row[f"{prefix}speedup"] = round(alone / batch, 3)
    row[f"{prefix}ids_per_s"] = round(b * grid / batch * 1e3)
    row[f"{prefix}ids_per_s_alone"] = round(b * grid / alone * 1e3)


def _chunks_exact(got, items, own, pool, chunk) -> bool:
    """Whether each chunk's (hidden, states) of a batch's read, `got`, and the KV rows it left
    in its page own[i] equal the chunk runner's alone (run after: it rewrites the rows)."""
    rows = [[x[own[i]].clone() for pair in pool.layers() for x in pair]
            for i in range(len(items))]
    exact = True
    for i, (h, states) in enumerate(got):
        want_h, want_states = chunk.run(*items[i])
        exact &= torch.equal(h, want_h) and all(
            torch.equal(x, y) for p, q in zip(states, want_states) for x, y in zip(p, q)) \
            and all(torch.equal(x, y) for x, y in zip(
                rows[i], [x[own[i]] for pair in pool.layers() for x in pair]))
    return bool(exact)


def cuda_ms(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() over iters calls (CUDA events), after warmup calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(device_ms(fn)[1] for _ in range(iters))


def speed_part(model, tiles: list[invariant.Tile], iters: int) -> dict:
    """Per projection shape and M: cuBLAS ms, and per tile the kernel's ms and ratio."""
    out = {}
    g = torch.Generator(device=model.device).manual_seed(1)
    for name, w in projection_shapes(model).items():
        for m in (512, 1024, 2048, 4096):
            x = torch.randn(m, w.shape[1], device=model.device, generator=g).to(model.dtype)
            row = {"cublas_ms": round(cuda_ms(lambda: F.linear(x, w), iters), 4)}
            for t in tiles:
                ms = cuda_ms(lambda t=t: invariant.linear_kernel(x, w, t), iters)
                key = f"{t.block_m}x{t.block_n}x{t.block_k}x{t.num_warps}x{t.num_stages}"
                row[key] = {"ms": round(ms, 4), "over_cublas": round(ms / row["cublas_ms"], 3)}
            out[f"{name} M={m}"] = row
            print(f"speed {name} M={m}: {row}", file=sys.stderr, flush=True)
    return out


def _readers(model, grid: int, arms: list[str], resident_bytes: int) -> dict:
    from adapters.eager import EagerAdapter
    from shadow_plugin.reader.reader import Reader
    readers = {}
    if "today" in arms:
        readers["today"] = Reader(model, grid=grid, resident_bytes=resident_bytes)
    if "bi" in arms:
        for arm in ("bi_alone", "bi_batch"):
            readers[arm] = Reader(EagerAdapter(model, grid, invariant=True),
                                  resident_bytes=resident_bytes)
    return readers


def _same_states(alone, batched, names) -> list[bool]:
    """Per session: the same committed count and state tensors, bit for bit."""
    out = []
    for s in names:
        x, y = alone.state_tensors(s), batched.state_tensors(s)
        out.append(alone.committed(s) == batched.committed(s) and x.keys() == y.keys()
                   and all(torch.equal(x[n], y[n]) for n in x))
    return out


def read_part(model, args) -> dict:
    """The `read` arms per context and B (module doc)."""
    out, g, num = {}, args.grid, max(args.batches)
    for context in args.contexts:
        readers = _readers(model, g, args.arms, args.resident_gib * 2**30)
        names = [f"s{i}" for i in range(num)]
        rounds = (args.repeats + 1) * len(args.batches)
        ids = {s: session_ids(context + g * (rounds + 1), 7919 * i + context)
               for i, s in enumerate(names)}
        at = {s: context for s in names}
        for arm, r in readers.items():              # the context: alone, or in batches
            for s in names:
                r.feed(s, ids[s][:context], "prompt")
            if arm == "bi_batch":
                while r.read_batch(names).num_chunks:
                    pass
            else:
                for s in names:
                    r.read(s)
        batched = readers["bi_batch"].adapter.batches() if "bi_batch" in readers else None
        if batched is False:                # read_batch would read one chunk a call: no arm
            print("bi_batch: the checks failed, the adapter reads one at a time (see probe)",
                  file=sys.stderr, flush=True)
            out[f"{context}_exact"] = {"batches": False}
        for b in args.batches:
            times: dict[str, list[float]] = {arm: [] for arm in readers}
            for k in range(args.repeats + 1):         # round 0: warm-up, not counted
                for s in names[:b]:
                    for r in readers.values():
                        r.feed(s, ids[s][at[s]:at[s] + g], "output")
                    at[s] += g
                for arm, r in readers.items():
                    if arm == "bi_batch" and not batched:
                        r.read_batch(names[:b])       # kept in step, not timed
                        continue
                    if arm == "bi_batch":
                        ms = device_ms(lambda r=r: r.read_batch(names[:b]))[1]
                    else:
                        ms = device_ms(lambda r=r: [r.read(s, max_chunks=1)
                                                    for s in names[:b]])[1]
                    if k:
                        times[arm].append(ms)
            row = {"context": context, "sessions": b}
            for arm, ts in times.items():
                if not ts:
                    continue
                ms = statistics.median(ts)
                row[arm] = {"ms": round(ms, 2), "chunks_per_s": round(b / ms * 1e3, 1),
                            "ids_per_s": round(b * g / ms * 1e3)}
            if "bi_batch" in row and "bi_alone" in row:
                row["speedup"] = round(row["bi_alone"]["ms"] / row["bi_batch"]["ms"], 3)
            if "bi_batch" in row and "today" in row:
                row["over_today"] = round(row["today"]["ms"] / row["bi_batch"]["ms"], 3)
            out[f"{context}x{b}"] = row
            print(f"read {row}", file=sys.stderr, flush=True)
        if batched:
            same = _same_states(readers["bi_alone"], readers["bi_batch"], names)
            out[f"{context}_exact"] = {"batches": True, "exact": all(same),
                                       "sessions_equal": sum(same), "sessions": len(same)}
            print(f"exact {context}: {out[f'{context}_exact']}", file=sys.stderr, flush=True)
        del readers
        gc.collect()
        torch.cuda.empty_cache()
    return out


def versions() -> dict:
    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("triton", "fla"):
        try:
            out[name] = __import__(name).__version__
        except Exception:                            # noqa: BLE001 (a missing or odd package)
            out[name] = None
    return out


def run(args) -> dict:
    from adapters import load_model
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("evals.bi_bench measures CUDA's kernels: no CUDA device here")
    model = load_model(args.model, device=args.device,
                       dtype=torch.bfloat16 if args.device == "cpu" else None)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "none (a smoke run)"
    res = {"model": args.model, "grid": args.grid, "dtype": str(model.dtype), "gpu": gpu,
           **versions(), "commit": git_commit(), "date": str(datetime.date.today())}
    parts = {"probe": lambda: probe_part(model, args.grid),
             "speed": lambda: speed_part(model, args.tiles, args.iters),
             "graphs": lambda: graphs_part(model, args),
             "questions": lambda: question_bench.questions_part(model, args),
             "chunks": lambda: chunks_part(model, args),
             "read": lambda: read_part(model, args)}
    for name in args.parts:
        res[name] = parts[name]()
        print(f"{name} {json.dumps(res[name])}", file=sys.stderr, flush=True)
        if args.out:                                # what a timeout leaves
            with open(args.out, "w") as f:
                json.dump(res, f)
    return res


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:qwen3.5-0.8b")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a smoke run of the code (bf16, Triton's interpreter), no figures")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--parts", default="probe,speed,read")
    ap.add_argument("--contexts", type=_ints, default=[16384, 65536])
    ap.add_argument("--batches", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--question-rows", type=_ints, default=[64, 128],
                    help="the questions' buckets (`questions`)")
    ap.add_argument("--ways", type=lambda t: [w for w in t.split(",") if w], default=None,
                    help="`questions`: the other ways to time beside the batch's own, by "
                         "name (OneCall.name, e.g. attention+recurrences+norms,per_fork); "
                         "default every way after it")
    ap.add_argument("--chunk-ways", type=lambda t: [w for w in t.split(",") if w], default=None,
                    help="`chunks`: the other ways to time beside the batch's own, by name "
                         "(OneCall.name of batch.CHUNK_WAYS but the batch's own, e.g. "
                         "recurrences+conv,recurrences,per_fork)")
    ap.add_argument("--chunk-ops", type=lambda t: [w for w in t.split(",") if w], default=None,
                    help="`chunks`: the chunk runner's op sets side by side, the first's arms "
                         "unprefixed: compiled (torch.compile's), rowwise (Runners(row_invariant"
                         "=True)), e.g. compiled,rowwise; default: the one the runners pick "
                         "here (rowwise on CUDA)")
    ap.add_argument("--profile", action="store_true", help="`questions`: the largest batch at "
                    "the largest context and smallest bucket also under torch.profiler; "
                    "`chunks`: one chunk and the largest batch at the smallest context")
    ap.add_argument("--ceiling", action="store_true",
                    help="`questions`, `chunks`: also one forward of the B questions' or "
                         "chunks' rows as one sequence (FA4 compiles one kind of call more "
                         "per row count)")
    ap.add_argument("--q-copies", action="store_true",
                    help="`questions`: also FA4's split calls with q copied (as question "
                         "batches ran them before they shared them), broadcast, and shared "
                         "by all forks (question_bench._q_copies)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tiles", default="64x128x64x4x3,128x128x64x8x3,64x64x64x4x4",
                    help="the invariant linear's tiles to time (BMxBNxBKxWARPSxSTAGES)")
    ap.add_argument("--arms", default="today,bi", help="today (the default CUDA reader, one "
                    "at a time) and bi ('eager+bi' alone and batched)")
    ap.add_argument("--resident-gib", type=int, default=24,
                    help="each reader's resident cap (8 sessions at 64k hold ~6.3 GiB of KV)")
    ap.add_argument("--out", help="also write the JSON here after each part")
    args = ap.parse_args(argv)
    known = {"probe", "speed", "graphs", "questions", "chunks", "read"}
    if not set(args.parts.split(",")) <= known:
        ap.error(f"--parts takes {', '.join(sorted(known))}; got {args.parts!r}")
    args.parts, args.arms = args.parts.split(","), args.arms.split(",")
    args.tiles = [invariant.Tile.parse(t) for t in args.tiles.split(",") if t]
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
