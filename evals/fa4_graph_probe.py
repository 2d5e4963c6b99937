"""Whether FlashAttention-4's calls over pages can run inside one CUDA graph captured once for
every position (issue 16: the chunk's eager FA4 calls between its graphs cost the host's lead
and, with the overlap, cross-stream waits; a backlog over pages reads 4-5 % slower than over
contiguous buffers, BENCHMARKS.md, 2026-12-02).

The way: fixed-width sub-page tables and per-sequence key counts on the device (FA4's
`seqused_k`) instead of tables sized to each chunk, so nothing a kernel's launch depends on
changes between positions with the same number of splits (`fa4_plan.split_plan`'s S: 4 on an
H200 from 4k keys on). One attention layer of the 0.8B (q [512, 8, 256], KV heads 2, bf16), in
pools of 512-row pages in shuffled order. For each context:
  (1) the runner's call: `attn_fa4.FA4Attention.attend` on one stream (and, timed only, with
      the overlap);
  (2) the same splits and causal tail through fixed-width tables and `seqused_k`, eager;
  (3) (2) captured in a CUDA graph once, at the first context, and replayed at every context
      with only the device tables, key counts and q changed.
Prints, per context, whether (2) and (3) equal (1) bit for bit (and the largest difference
when not) and the milliseconds of one layer (CUDA events around each call, median of
--repeats after 3 warm-ups) of each, one JSON object a context (lines starting "#" say what
runs next, with the seconds so far: the first calls compile); the last line is one JSON
object. The eager fixed calls go through the package's Python (about 0.1 ms a call), the
runner's through its recorded kernels: the graph's time compares with the runner's. CUDA
with flash-attn-4 (Hopper) only; a step that fails reports its error and the others go on.

    python -m evals.fa4_graph_probe --contexts 16384,98304
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch

from adapters.model import attn_fa4, fa4_plan
from adapters.model.attn_combine import combine_lse
from adapters.model.fa4_plan import SUB_PAGE, TILE_MN, split_plan
from evals import attn_kernel

H, HKV, D, T, G = 8, 2, 256, 512, 512          # heads, KV heads, head dim, chunk, page rows


class Fixed:
    """One layer's splits and causal tail in fixed shapes on the device: S splits, their
    tables [S, W] and the tail's [1, W] int32 (W: sub-pages of the largest context), key
    counts [S] and [1] int32, q [T, H, D] and the outputs, so a graph captured once serves
    every position with S splits (`set` writes a position's values in place)."""

    def __init__(self, s: int, max_end: int, num_sms: int, dev, dtype):
        w, z = -(-max_end // SUB_PAGE), lambda *n, dt=torch.int32: torch.zeros(
            *n, dtype=dt, device=dev)
        self.s, self.num_sms = s, num_sms
        self.split_tab, self.split_len = z(s, w), z(s)
        self.tail_tab, self.tail_len = z(1, w), z(1)
        self.q, self.qs = z(T, H, D, dt=dtype), z(s, T, H, D, dt=dtype)
        self.o_part = z(s + 1, T, H, D, dt=dtype)
        self.lse_part = z(s + 1, H, T, dt=torch.float32)
        self.out = z(T, H * D, dt=dtype)

    def set(self, q: torch.Tensor, pos: int, pages) -> None:
        """The tables, key counts and q of a chunk at pos over `pages` (page indices in row
        order). Raises ValueError when split_plan gives pos another number of splits."""
        s, ls = split_plan(pos, T, H, HKV, self.num_sms)
        if s != self.s:
            raise ValueError(f"pos {pos} has {s} splits, the capture {self.s}")
        sub = torch.from_numpy(fa4_plan.all_sub_pages(pages, G))    # int32, row order
        per, n = ls // SUB_PAGE, (pos + T) // SUB_PAGE
        split_tab = torch.zeros(self.split_tab.shape, dtype=torch.int32)
        split_tab[:, :per] = sub[:s * per].view(s, per)
        tail_tab = torch.zeros(self.tail_tab.shape, dtype=torch.int32)
        tail_tab[0, :n - s * per] = sub[s * per:n]
        self.split_tab.copy_(split_tab)
        self.tail_tab.copy_(tail_tab)
        self.split_len.fill_(ls)
        self.tail_len.fill_(pos + T - s * ls)
        self.q.copy_(q)

    def poison(self) -> None:
        """NaN into every buffer a run writes, so a run that leaves one unwritten (a kernel
        missing from a capture, say) cannot pass on the last run's values."""
        for x in (self.qs, self.o_part, self.lse_part, self.out):
            x.fill_(float("nan"))

    def run(self, k_sub: torch.Tensor, v_sub: torch.Tensor, fwd) -> None:
        """The splits, the tail and the combine into self.out (capturable: no host reads)."""
        s = self.s
        self.qs.copy_(self.q[None].expand_as(self.qs))
        fwd(self.qs, k_sub, v_sub, page_table=self.split_tab, seqused_k=self.split_len,
            causal=False, tile_mn=TILE_MN, out=self.o_part[:s], lse=self.lse_part[:s])
        fwd(self.q[None], k_sub, v_sub, page_table=self.tail_tab, seqused_k=self.tail_len,
            causal=True, tile_mn=TILE_MN, out=self.o_part[s:], lse=self.lse_part[s:])
        combine_lse(self.o_part, self.lse_part, self.out)


def timed(fn, repeats: int) -> float:
    """evals/attn_kernel.timed (median ms, CUDA events, 3 warm-ups), rounded for the report."""
    return round(attn_kernel.timed(fn, repeats), 4)


def _same(x: torch.Tensor, ref: torch.Tensor) -> dict:
    """Bit equality, the largest finite difference, and how many values are not finite."""
    diff = (x.float() - ref.float()).abs()
    finite = torch.isfinite(diff)
    return {"same_bits": bool(torch.equal(x, ref)),
            "max_abs_diff": float(diff[finite].max()) if finite.any() else None,
            "num_not_finite": int((~finite).sum())}


def _step(report: dict, key: str, fn) -> None:
    """report[key] = fn(), or {"error": ...}: one failed step leaves the others running."""
    try:
        report[key] = fn()
    except Exception as e:                          # noqa: BLE001 (a probe reports all)
        cause = e.__cause__ or e.__context__          # a capture's own error hides the first
        first = f" (after {type(cause).__name__}: {cause})" if cause else ""
        report[key] = {"error": f"{type(e).__name__}: {e}"[:400] + first[:400]}


def probe(contexts: list[int], repeats: int, seed: int = 0) -> dict:
    from flash_attn.cute.interface import _flash_attn_fwd as fwd
    dev, dt = torch.device("cuda"), torch.bfloat16
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(seed)
    max_end = max(contexts) + T
    num_pages = -(-max_end // G) + 4
    k_pool, v_pool = (torch.randn(num_pages, G, HKV, D, device=dev, generator=g).to(dt)
                      for _ in "kv")
    k_sub, v_sub = (x.view(-1, SUB_PAGE, HKV, D) for x in (k_pool, v_pool))
    pages = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    serial, overlap = attn_fa4.FA4Attention(H, HKV, overlap=False), attn_fa4.FA4Attention(H, HKV)
    s = split_plan(contexts[0], T, H, HKV, num_sms)[0]
    fixed, rows, capture = Fixed(s, max_end, num_sms, dev, dt), [], {}
    t0 = time.perf_counter()
    say = lambda what: print(f"# {time.perf_counter() - t0:.1f} s: {what}", flush=True)  # noqa
    for pos in contexts:
        q = torch.randn(T, H, D, device=dev, generator=g).to(dt)
        row, ref = {"pos": pos}, torch.empty(T, H * D, device=dev, dtype=dt)
        say(f"pos {pos}: the runner's calls (compiled at the first)")
        _step(row, "runner", lambda: _runner(serial, overlap, q, pos, pages, k_pool, v_pool,
                                             ref, repeats))
        if "error" not in row["runner"]:
            say(f"pos {pos}: fixed tables, eager (compiled at the first)")
            _step(row, "fixed_eager", lambda: _eager(fixed, q, pos, pages, k_sub, v_sub, fwd,
                                                     ref, repeats))
            if not capture:                # once, at the first context (after its eager run)
                say("capture")
                _step(capture, "graph", lambda: _capture(fixed, k_sub, v_sub, fwd))
            graph = capture["graph"]
            if isinstance(graph, dict):
                row["fixed_graph"] = {"error": f"not captured ({graph['error']})"}
            else:
                _step(row, "fixed_graph", lambda: _replayed(fixed, graph, q, pos, pages, ref,
                                                            repeats))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"rows": rows, "captured": not isinstance(capture.get("graph", {}), dict)}


def _runner(serial, overlap, q, pos, pages, k_pool, v_pool, ref, repeats) -> dict:
    """The runner's call into ref (one stream), and its time on one stream and overlapped."""
    plan = serial.plan(pos, T, pages, G, q.device)
    serial.attend(q, pos, k_pool, v_pool, plan, ref)
    out = torch.empty_like(ref)
    return {"splits": list(plan.splits),
            "ms_one_stream": timed(lambda: serial.attend(q, pos, k_pool, v_pool, plan, out),
                                   repeats),
            "ms_overlap": timed(lambda: overlap.attend(q, pos, k_pool, v_pool, plan, out),
                                repeats)}


def _eager(fixed: Fixed, q, pos, pages, k_sub, v_sub, fwd, ref, repeats) -> dict:
    fixed.poison()
    fixed.set(q, pos, pages)
    fixed.run(k_sub, v_sub, fwd)
    same = _same(fixed.out, ref)
    return {**same, "ms": timed(lambda: fixed.run(k_sub, v_sub, fwd), repeats)}


def _capture(fixed: Fixed, k_sub, v_sub, fwd) -> torch.cuda.CUDAGraph:
    """The fixed calls captured once (after a warm-up on a side stream, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fixed.run(k_sub, v_sub, fwd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fixed.run(k_sub, v_sub, fwd)
    return graph


def _replayed(fixed: Fixed, graph, q, pos, pages, ref, repeats) -> dict:
    fixed.poison()
    fixed.set(q, pos, pages)
    graph.replay()
    same = _same(fixed.out, ref)
    return {**same, "ms": timed(graph.replay, repeats)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=lambda x: [int(c) for c in x.split(",")],
                    default=[16384, 98304], help="positions of the chunk (multiples of 64)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1")
    bad = [c for c in args.contexts if c % SUB_PAGE or c < 4096]
    if bad:
        ap.error(f"contexts {bad}: multiples of {SUB_PAGE}, at least 4096 (4 splits on an "
                 "H200)")
    if not torch.cuda.is_available() or not attn_fa4.available(torch.device("cuda"),
                                                                torch.bfloat16):
        ap.error("needs a Hopper GPU with flash-attn-4")
    res = probe(args.contexts, args.repeats)
    print(json.dumps({"probe": "fa4_graph_probe", "gpu": torch.cuda.get_device_name(),
                      "dtype": "bfloat16", "torch": torch.__version__,
                      "fa4": attn_fa4.package_version(),
                      "date": datetime.date.today().isoformat(), **res}))


if __name__ == "__main__":
    main()
