"""FlashAttention-4's Hopper forward (model.attn_fa4) against FlashAttention-2 as torch ships it
(model.attn_flash), as the reader calls them (`fa4`: attn_fa4.FA4Attention, its recorded kernels
called directly; `fa4_package`: the same splits through the package's Python each call;
`fa4_one_call`: FA4 as one causal call on contiguous rows, without the key splits; the first
two over the rows as 512-row pages in order, as the reader's pools hold them): shapes of
random:qwen3.5-0.8b (H 8, Hkv 2, D 256),
bf16, one 512-id chunk at 8k-100k context, a 768-row question bucket at 32k and one decode
token at 100k. For each: median GPU ms (CUDA events, warmed up), the host's ms per call (calls
issued behind a long GPU sleep, so the host never waits), relative RMS against the fp32 twin
(ref.attend_ref), determinism (two calls equal) and capacity independence (the same rows in a
buffer 4,096 rows larger give the same bits). Last line: one JSON object.

    python -m evals.fa4_probe
"""
from __future__ import annotations

import json
import time

import torch

from adapters.model import attn_fa4, attn_flash  # noqa: E402
from evals.attn_kernel import DEV, probe_cases, rel_rms, timed  # noqa: E402
from evals.bench import versions  # noqa: E402


def fa4_one_call(q, pos, k_buf, v_buf, out):
    """FA4 as the package alone would run it: one causal call, no key splits (its SM90 limit)."""
    t, h, d = q.shape
    attn_fa4._forward()(q.contiguous()[None], k_buf[:pos + t][None], v_buf[:pos + t][None],
                        causal=True, out=out.view(1, t, h, d))


class ThroughThePackage(attn_fa4.FA4Attention):
    """attn_fa4's splits with every FA4 call through the package's Python (no direct calls)."""

    def _fwd(self, q, k, v, page_table, causal, out, lse):
        attn_fa4._forward()(q, k, v, page_table=page_table, causal=causal,
                            tile_mn=attn_fa4.TILE_MN, out=out, lse=lse)


def over_pages(attn: attn_fa4.FA4Attention):
    """attn.attend over contiguous rows k_buf, v_buf [cap, Hkv, D] read as 512-row pages in
    order (rows past cap padded with zeros to a whole page). The padded pools and the plan
    are built at the first call for those buffers and kept (the runner stages its plan;
    neither is in the timed calls). FA4 over pages reads 64-row sub-pages, so a position off
    them (one decode token) fails with the reason."""
    kept: dict = {}

    def attend(q, pos, k_buf, v_buf, out):
        key = (k_buf.data_ptr(), v_buf.data_ptr(), k_buf.shape[0], pos, q.shape[0])
        if kept.get("key") != key:
            n = -(-k_buf.shape[0] // 512)
            k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, n * 512 - x.shape[0]))
                    .view(n, 512, *x.shape[1:]) for x in (k_buf, v_buf))
            kept.update(key=key, k=k, v=v,
                        plan=attn.plan(pos, q.shape[0], list(range(n)), 512, q.device))
        attn.attend(q, pos, kept["k"], kept["v"], kept["plan"], out)
    return attend


IMPLS = {"fa2": attn_flash.attend, "fa4": over_pages(attn_fa4.FA4Attention(8, 2)),
         "fa4_package": over_pages(ThroughThePackage(8, 2)), "fa4_one_call": fa4_one_call}


def host_ms(call, n: int = 50) -> float:
    """The host's ms per call, the GPU kept busy by a sleep queued first (nothing waits)."""
    call()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)            # ~1 s of GPU cycles ahead of the calls
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    ms = (time.perf_counter() - t0) * 1e3 / n
    torch.cuda.synchronize()
    return round(ms, 4)


def measure(attend, q, kb, vb, pos, ref) -> dict:
    t, h, d = q.shape
    out = torch.empty(t, h * d, device=DEV, dtype=q.dtype)
    call = lambda: attend(q, pos, kb, vb, out)  # noqa: E731
    call()
    a = out.clone()
    call()
    row = {"ms": round(timed(call), 4), "host_ms": host_ms(call),
           "deterministic": bool(torch.equal(a, out))}
    end = pos + t
    small = torch.empty_like(out)
    attend(q, pos, kb[:end].clone(), vb[:end].clone(), small)
    row["capacity_independent"] = bool(torch.equal(small, a))
    if ref is not None:
        row["rel_rms_vs_fp32"] = round(rel_rms(a, ref), 6)
    return row, a


def main() -> None:
    def measure_case(t, pos, q, kb, vb, ref):
        rows, outs = {}, {}
        for name, attend in IMPLS.items():
            try:
                rows[name], outs[name] = measure(attend, q, kb, vb, pos, ref)
            except Exception as e:               # an implementation that fails: say why
                rows[name] = f"failed: {type(e).__name__}: {e}"[:400]
        if "fa4" in outs and "fa2" in outs:
            rows["fa4_vs_fa2_rel_rms"] = round(rel_rms(outs["fa4"], outs["fa2"]), 6)
            rows["speedup"] = round(rows["fa2"]["ms"] / rows["fa4"]["ms"], 3)
            rows["split_plan"] = attn_fa4.split_plan(pos, t, 8, 2, attn_fa4._num_sms(0))
        return rows

    res = {"shape": [8, 2, 256], **versions(), "cases": probe_cases(768, measure_case)}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
