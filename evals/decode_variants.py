"""Why the table attention's decode reads its keys at about 2 TB/s where FlashAttention-2 reads
the same rows at 2.5 (issue 16: 0.101 against 0.065 ms a layer at 100k, BENCHMARKS.md). A
probe-only copy of `attn_triton._attn_split_kernel` for one query position, whose page-table
walk is a switch:

- `table`: today's walk; each block's page entry is loaded in the block's own iteration, so
  its keys' addresses wait on that load (Triton's pipeliner may then not prefetch them);
- `none`: no page table (the rows contiguous): what the walk costs at most;
- `ahead`: the next block's entry loaded one iteration ahead (a loop-carried scalar);
- `hoist`: the split's entries loaded as one [NPS] vector before the loop, a block's picked
  from registers (the split may span at most NPS pages: checked on the host).

Each over a few tilings, with FlashAttention-2 on contiguous rows and today's `DECODE`, timed
inside CUDA graphs (`attn_kernel.graph_timed`: no host time), in turns, medians of rounds.
Every variant's output is compared with `DECODE`'s bit for bit (the same tiling gives the same
sums) and with the fp32 twin. Shapes of random:qwen3.5-0.8b (H 8, Hkv 2, D 256), bf16, shuffled
512-row pages. Last line: one JSON object.

    python -m evals.decode_variants [--rounds 5] [--contexts 51200,102400]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from adapters.model import attn_flash
from adapters.model import attn_triton as at
from adapters.model.attn_combine import _attn_combine_vec_kernel, _split_len
from adapters.model.attn_triton import _block_at
from adapters.model.ref import attend_ref
from evals import attn_kernel
from evals.bench import versions
from evals.decode_probe import DEV, DT, PAGE, pools

WALKS = {"table": 1, "none": 0, "ahead": 2, "hoist": 3}


@triton.jit
def _decode_kernel(Q, KP, VP, TAB, PT, O_PART, L_PART, POS, scale_log2, H: tl.constexpr,
                   HKV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, S_MAX: tl.constexpr, MIN_SPLIT: tl.constexpr,
                   PAGE: tl.constexpr, WALK: tl.constexpr, NPS: tl.constexpr,
                   PTR: tl.constexpr):
    """Program (kv head, split) for T = 1: rows are the G = H / HKV heads (padded to BLOCK_M).
    PTR: where the pools' places come from: 0 the arguments KP, VP; 1 addresses in TAB (as
    attn_triton does today: an int64 said to be a multiple of 16, cast to a pointer); 2 an
    anchor KP (a tensor of the pools' dtype) plus element offsets in TAB (multiples of 8)."""
    G: tl.constexpr = H // HKV
    kvh, s = tl.program_id(0), tl.program_id(1)
    if PTR == 1:
        KP = tl.multiple_of(tl.load(TAB), 16).to(tl.pointer_type(Q.dtype.element_ty))
        VP = tl.multiple_of(tl.load(TAB + 1), 16).to(tl.pointer_type(Q.dtype.element_ty))
    elif PTR == 2:
        VP = KP + tl.multiple_of(tl.load(TAB + 1), 8)
        KP = KP + tl.multiple_of(tl.load(TAB), 8)
    pos = tl.load(POS)
    split = _split_len(pos + 1, S_MAX, MIN_SPLIT, BLOCK_N)
    lo = s * split
    hi = tl.minimum(lo + split, pos + 1)
    if lo < hi:
        rows = tl.arange(0, BLOCK_M)
        head = kvh * G + rows % G
        row_ok = rows < G
        t = rows * 0
        d = tl.arange(0, D)
        q = tl.load(Q + head[:, None] * D + d[None, :], mask=row_ok[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        full_end = lo + (hi - lo) // BLOCK_N * BLOCK_N
        jj = tl.arange(0, NPS)
        p_lo = lo // PAGE
        pvec = tl.load(PT + p_lo + jj, mask=p_lo + jj <= (hi - 1) // PAGE, other=0)
        pg = tl.load(PT + p_lo).to(tl.int64)
        for start in range(lo, full_end, BLOCK_N):
            if WALK == 0:
                base = start * 0
            elif WALK == 1:
                base = tl.load(PT + start // PAGE).to(tl.int64) * PAGE - start // PAGE * PAGE
            elif WALK == 2:
                nxt = tl.load(PT + (start + BLOCK_N) // PAGE, mask=start + BLOCK_N < hi,
                              other=0).to(tl.int64)
                base = pg * PAGE - start // PAGE * PAGE
                pg = nxt
            else:
                sel = tl.sum(tl.where(jj == start // PAGE - p_lo, pvec, 0))
                base = sel.to(tl.int64) * PAGE - start // PAGE * PAGE
            m_i, l_i, acc = _block_at(q, KP, VP, base, start, hi, pos, t, kvh, m_i, l_i, acc,
                                      scale_log2, HKV, D, BLOCK_N, False)
        for start in range(full_end, hi, BLOCK_N):
            if WALK == 0:
                base = start * 0
            else:
                base = tl.load(PT + start // PAGE).to(tl.int64) * PAGE - start // PAGE * PAGE
            m_i, l_i, acc = _block_at(q, KP, VP, base, start, hi, pos, t, kvh, m_i, l_i, acc,
                                      scale_log2, HKV, D, BLOCK_N, True)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        tl.store(O_PART + (s * H + head)[:, None] * D + d[None, :], acc / l_safe[:, None],
                 mask=row_ok[:, None])
        tl.store(L_PART + s * H + head, m_i + tl.log2(l_safe), mask=row_ok)


def attend(q, k, v, pages, pos_t, pos, out, scratch, cfg: at.SplitConfig, walk: str,
           page_rows: int, nps: int = 8, ptr: int = 0, tab=None, num_kv_heads: int = 2):
    """One decode row q [1, H, D] over pools k, v [num_pages, page_rows, Hkv, D] (for walk
    'none': the rows in order, [ctx, Hkv, D]) through page table `pages` (int64) -> out
    [1, H * D] (scratch: at.scratch's pair for cfg); splits combined by attn_combine's vector
    kernel. ValueError when a split may span more than nps pages under walk 'hoist'. ptr, tab:
    _decode_kernel's PTR and TAB (ptr 2: k is the anchor, tab the offsets from it);
    num_kv_heads: Hkv (given, since an anchor has no head dimension)."""
    _, h, d = q.shape
    hkv = num_kv_heads
    per_split = -(-(pos + 1) // cfg.s_max)                   # _split_len's rounding
    split = max(-(-per_split // cfg.block_n) * cfg.block_n, cfg.min_split)
    if walk == "hoist" and -(-split // page_rows) + 1 > nps:
        raise ValueError(f"splits of {split} keys may span more than {nps} pages")
    o_part, l_part = scratch
    _decode_kernel[(hkv, cfg.s_max)](q, k, v, pages if tab is None else tab, pages, o_part,
                                     l_part, pos_t,
                                     d ** -0.5 * 1.4426950408889634, H=h, HKV=hkv, D=d,
                                     BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, S_MAX=cfg.s_max,
                                     MIN_SPLIT=cfg.min_split, PAGE=page_rows, WALK=WALKS[walk],
                                     NPS=nps, PTR=ptr, num_warps=cfg.num_warps,
                                     num_stages=cfg.num_stages)
    _attn_combine_vec_kernel[(h, d // 64)](o_part, l_part, out, pos_t, 1, H=h, D=d,
                                           ALIGN=cfg.block_n, S_MAX=cfg.s_max,
                                           MIN_SPLIT=cfg.min_split, BLOCK_D=64)
    return out


def _cfg(**kw) -> at.SplitConfig:
    return at.SplitConfig(**{"block_m": 16, "s_max": 128, "min_split": 512, "num_warps": 4,
                             "vector_combine": True, **kw})


# (walk, tiling[, ptr]): DECODE's tiling under every walk, the pools' places as today
# (ptr 1) and from an anchor (ptr 2), then the walks that free the loads from the table under
# deeper pipelines, more warps and 64-key blocks
VARIANTS = {f"{w}": (w, _cfg()) for w in WALKS} | {
    f"{w}_ptr{p}": (w, _cfg(**kw), p) for w, kw in (("table", {}), ("ahead", {"num_stages": 3}))
    for p in (1, 2)} | {
    f"{w}_st{s}": (w, _cfg(num_stages=s)) for w in ("none", "ahead", "hoist") for s in (1, 3, 4)
} | {f"{w}_w8": (w, _cfg(num_warps=8)) for w in ("none", "ahead", "hoist")} | {
    f"{w}_bn64_w8": (w, _cfg(block_n=64, num_warps=8)) for w in ("none", "ahead", "hoist")
} | {"table_w8_st1": ("table", _cfg(num_warps=8, num_stages=1)),
     "table_w8_st3": ("table", _cfg(num_warps=8, num_stages=3))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--contexts", default="51200,102400")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    args = ap.parse_args(argv)
    only = [x for x in args.only.split(",") if x]
    if set(only) - set(VARIANTS):
        raise SystemExit(f"--only names variants of {sorted(VARIANTS)}")
    variants = {k: v for k, v in VARIANTS.items() if not only or k in only}
    dev, dt, page = DEV, DT, PAGE
    res = {}
    for ctx in (int(x) for x in args.contexts.split(",")):
        pos, n = ctx - 1, -(-ctx // page)
        k, v, order = pools(ctx, 1)                 # n pages in shuffled places among n + 8
        rows_k, rows_v = k[order].flatten(0, 1)[:ctx].contiguous(), \
            v[order].flatten(0, 1)[:ctx].contiguous()
        gen = torch.Generator(device=dev).manual_seed(2)
        q = torch.randn(1, 8, 256, device=dev, generator=gen).to(dt)
        pos_t = torch.tensor([pos], device=dev)
        ptrs = torch.tensor([k.data_ptr(), v.data_ptr()], device=dev)
        in_order = torch.arange(n, device=dev)
        want = attend_ref(q, rows_k, rows_v, pos)
        outs = {name: torch.empty(1, 8 * 256, device=dev, dtype=dt) for name in variants}
        ref_out = torch.empty(1, 8 * 256, device=dev, dtype=dt)
        fa2_out = torch.empty_like(ref_out)
        op, lp = at.scratch(1, 8, 256, at.DECODE, dev)
        anchor, offsets = attn_kernel.pool_args(k, v)
        calls = {"fa2_contiguous": lambda: attn_flash.attend(q, pos, rows_k, rows_v, fa2_out),
                 "DECODE": lambda: at.attend_table(q, anchor, offsets, pos_t, 2, op, lp,
                                                   ref_out, at.DECODE, order, page)}
        calls["DECODE"]()
        row = {}
        for name, (walk, cfg, *ptr) in variants.items():
            ptr = ptr[0] if ptr else 0
            kk, vv, pt = (rows_k, rows_v, in_order) if walk == "none" else (k, v, order)
            kk, vv, tab = {0: (kk, vv, None), 1: (kk, vv, ptrs),
                           2: (anchor, anchor, offsets)}[ptr]
            sc = at.scratch(1, 8, 256, cfg, dev)
            calls[name] = (lambda kk=kk, vv=vv, pt=pt, walk=walk, cfg=cfg, o=outs[name], sc=sc,
                           ptr=ptr, tab=tab:
                           attend(q, kk, vv, pt, pos_t, pos, o, sc, cfg, walk, page, ptr=ptr,
                                  tab=tab))
            calls[name]()
            row[name + "_rel_rms"] = round(attn_kernel.rel_rms(outs[name], want), 5)
            if cfg.block_n == at.DECODE.block_n:
                row[name + "_bits_as_DECODE"] = torch.equal(outs[name], ref_out)
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                times[name].append(attn_kernel.graph_timed(fn))
        row.update({name: round(statistics.median(t), 4) for name, t in times.items()})
        res[f"{ctx // 1024}k"] = row
        print(ctx, {k2: v2 for k2, v2 in row.items() if not k2.endswith("_rel_rms")}, flush=True)
    print(json.dumps({"probe": "decode_variants", "dtype": "bfloat16",
                      "gpu": torch.cuda.get_device_name(), **versions(), "rounds": args.rounds,
                      "results": res}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
