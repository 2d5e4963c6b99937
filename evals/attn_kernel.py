"""The table-addressed attention kernel (adapters/model/attn_triton.py) on the GPU: agreement
with SDPA flash and the fp32 twin in bfloat16, determinism, independence from the buffer's
capacity, a CUDA graph replayed at other positions, and its time beside SDPA for one 512-id chunk
(and one decode token) at 8k-100k context, for a few tilings. Shapes of random:qwen3.5-0.8b
(H 8, Hkv 2, D 256) unless --heads/--kv-heads say otherwise. Last line: one JSON object.

    python -m evals.attn_kernel [--configs 64x64x8x2,128x64x8x2]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from adapters.model import attn_triton as at
from adapters.model.ref import attend_ref
from evals.bench import versions

DEV = torch.device("cuda")


def rel_rms(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt())


def timed(fn, repeats=20) -> float:
    """Median ms of fn over `repeats` runs (CUDA events), after 3 warm-up runs."""
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e))
    return statistics.median(out)


def graph_timed(fn, calls: int = 20, replays: int = 10) -> float:
    """GPU ms a call with no host time in it: `calls` calls captured in one CUDA graph, the
    median of `replays` replays (CUDA events) over calls, after a warm-up replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()                                  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    out = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / calls)
    return round(statistics.median(out), 4)


def case(t, pos, h, hkv, d, cap=None, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    cap = -(-(cap or pos + t) // 512) * 512             # whole pages of 512 rows (as_pages)
    kb = torch.randn(cap, hkv, d, device=DEV, generator=g).bfloat16()
    vb = torch.randn(cap, hkv, d, device=DEV, generator=g).bfloat16()
    q = torch.randn(t, h, d, device=DEV, generator=g).bfloat16()
    return q, kb, vb


def probe_cases(question_rows: int, measure_case) -> dict:
    """The attention probes' cases (random:qwen3.5-0.8b heads: H 8, Hkv 2, D 256): one 512-id
    chunk at 8k-100k context, a question of `question_rows` rows at 32k, one decode token at
    100k, each over a buffer 4,096 rows larger than it needs. measure_case(t, pos, q, kb, vb,
    ref) -> a dict of rows (ref: the fp32 twin's output at 16k, 32k and 100k, else None),
    printed per case; returns {"T{t}_ctx{L}": rows}."""
    out = {}
    cases = [(512, c - 512) for c in (8192, 16384, 32768, 65536, 100352)]
    cases += [(question_rows, 32768), (1, 100352)]
    for t, pos in cases:
        q, kb, vb = case(t, pos, 8, 2, 256, cap=pos + t + 4096)
        ref = attend_ref(q, kb, vb, pos) if pos in (16384 - 512, 32768, 100352) else None
        key = f"T{t}_ctx{pos + t}"
        out[key] = measure_case(t, pos, q, kb, vb, ref)
        print(key, json.dumps(out[key]), flush=True)
        del q, kb, vb, ref
        torch.cuda.empty_cache()
    return out


def pool_args(k, v, base=None):
    """(base, places) for the table attention over the pools k, v: `base` (default a new [8]
    tensor of their dtype on their device) and their element offsets from it, [2] int64
    (attn_triton.pool_places: ValueError for another dtype or a pool off 16 bytes)."""
    base = torch.empty(8, device=k.device, dtype=k.dtype) if base is None else base
    return base, torch.tensor(at.pool_places(base, (k, v)), device=k.device)


def as_pages(kb, vb, page_rows: int = 512):
    """Contiguous rows kb, vb [cap, Hkv, D] (cap a multiple of page_rows) as the table
    attention takes them: (base, places, pages): pages 0, 1, ... in order."""
    base, places = pool_args(kb, vb)
    return base, places, torch.arange(kb.shape[0] // page_rows, device=DEV)


def run_table(q, kb, vb, pos, cfg):
    t, h, d = q.shape
    base, places, pages = as_pages(kb, vb)
    posd = torch.tensor([pos], device=DEV)
    o_part, l_part = at.scratch(t, h, d, cfg, DEV)
    out = torch.empty(t, h * d, device=DEV, dtype=q.dtype)
    fn = lambda: at.attend_table(q, base, places, posd, kb.shape[1], o_part, l_part, out,  # noqa
                                 cfg, pages, 512)
    return fn, out


def sdpa(q, kb, vb, pos):
    t, end = q.shape[0], pos + q.shape[0]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        o = F.scaled_dot_product_attention(
            q.permute(1, 0, 2)[None], kb[:end].permute(1, 0, 2)[None],
            vb[:end].permute(1, 0, 2)[None], attn_mask=causal_lower_right(t, end),
            enable_gqa=True)
    return o[0].permute(1, 0, 2).reshape(t, -1)


def checks(h, hkv, d) -> dict:
    out = {}
    for t, pos in ((512, 0), (512, 7680), (512, 32256), (512, 101888), (1, 102400), (37, 5000)):
        q, kb, vb = case(t, pos, h, hkv, d)
        fn, o = run_table(q, kb, vb, pos, at.READ if t > 1 else at.DECODE)
        fn()
        a = o.clone()
        fn()
        ref = attend_ref(q, kb, vb, pos)
        key = f"T{t}_pos{pos}"
        out[key] = {"rel_rms_vs_fp32": rel_rms(a, ref), "sdpa_rel_rms_vs_fp32":
                    rel_rms(sdpa(q, kb, vb, pos), ref), "deterministic": bool(torch.equal(a, o))}
    q, kb, vb = case(512, 20000, h, hkv, d, cap=20992)
    fn, o = run_table(q, kb, vb, 20000, at.READ)
    fn()
    big_k = torch.full((40448, hkv, d), 7.0, device=DEV, dtype=kb.dtype)
    big_v = torch.full((40448, hkv, d), -7.0, device=DEV, dtype=kb.dtype)
    big_k[:20992], big_v[:20992] = kb, vb
    fn2, o2 = run_table(q, big_k, big_v, 20000, at.READ)
    fn2()
    out["capacity_independent"] = bool(torch.equal(o, o2))
    out["graph_replay_equal"] = graph_check(h, hkv, d)
    return out


def graph_check(h, hkv, d) -> bool:
    """Capture once at one position, replay at others (pos in device memory): equal to a
    direct call at each."""
    q, kb, vb = case(512, 30000, h, hkv, d)
    base, places, pages = as_pages(kb, vb)
    posd = torch.tensor([0], device=DEV)
    o_part, l_part = at.scratch(512, h, d, at.READ, DEV)
    out = torch.empty(512, h * d, device=DEV, dtype=q.dtype)
    call = lambda: at.attend_table(q, base, places, posd, hkv, o_part, l_part, out,  # noqa
                                   at.READ, pages, 512)
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    ok = True
    for pos in (512, 9000, 29488):
        posd.fill_(pos)
        graph.replay()
        got = out.clone()
        call()
        ok &= bool(torch.equal(got, out))
    return ok


def speed(h, hkv, d, configs) -> dict:
    res = {}
    for ctx in (8192, 16384, 32768, 65536, 100352):
        q, kb, vb = case(512, ctx - 512, h, hkv, d)
        row = {"sdpa_ms": round(timed(lambda: sdpa(q, kb, vb, ctx - 512)), 3)}
        for name, cfg in configs.items():
            try:
                fn, _ = run_table(q, kb, vb, ctx - 512, cfg)
                row[name] = round(timed(fn), 3)
            except Exception as e:               # a tiling that does not fit: say so
                row[name] = f"failed: {type(e).__name__}: {e}"[:200]
        res[f"chunk512_at_{ctx // 1024}k"] = row
    q, kb, vb = case(1, 100352, h, hkv, d)
    row = {"sdpa_ms": round(timed(lambda: sdpa(q, kb, vb, 100352)), 3)}
    variants = {"decode_cfg": at.DECODE}
    for bm, bn, w, s_max, min_split in ((16, 64, 4, 16, 512), (16, 32, 4, 64, 512),
                                        (16, 64, 2, 64, 512), (16, 128, 4, 32, 1024),
                                        (16, 64, 4, 128, 256)):
        variants[f"{bm}x{bn}x{w} s{s_max} m{min_split}"] = at.SplitConfig(
            block_m=bm, block_n=bn, num_warps=w, s_max=s_max, min_split=min_split)
    for name, cfg in variants.items():
        try:
            fn, _ = run_table(q, kb, vb, 100352, cfg)
            row[name] = round(timed(fn), 3)
        except Exception as e:
            row[name] = f"failed: {type(e).__name__}: {e}"[:200]
    res["decode_at_98k"] = row
    return res


def parse_configs(text: str) -> dict:
    out = {"read_cfg": at.READ}
    for item in filter(None, text.split(",")):
        out[item] = at.SplitConfig.parse(item)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--configs", default="64x32x4x2,128x64x8x2,64x64x4x3")
    a = p.parse_args()
    res = {"shape": [a.heads, a.kv_heads, a.head_dim], **versions()}
    for key, fn in (("checks", lambda: checks(a.heads, a.kv_heads, a.head_dim)),
                    ("speed_ms", lambda: speed(a.heads, a.kv_heads, a.head_dim,
                                               parse_configs(a.configs)))):
        try:
            res[key] = fn()
        except Exception as e:                   # report and go on
            res[key] = f"failed: {type(e).__name__}: {e}"[:800]
        print(key, json.dumps(res[key], indent=1), flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
