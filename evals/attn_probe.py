"""Which library attention can read a chunk over a session's KV buffer faster than our Triton
kernel, with bits that depend only on (pos, T, values)? Shapes of random:qwen3.5-0.8b (H 8,
Hkv 2, D 256), bf16, one 512-id chunk at 8k-98k context, a 620-row question at 32k and one decode
token at 98k. For each variant: median ms (CUDA events, warmed up), relative RMS against the fp32
twin (at 16k), determinism (two calls equal) and capacity independence (the same rows in a buffer
4,096 rows larger give the same bits). Last line: one JSON object.

Variants: `sdpa` (F.scaled_dot_product_attention, flash, lower-right causal, GQA), `ours`
(attn_triton READ / DECODE), `fa_sN` (torch.ops.aten._flash_attention_forward on the buffer's
rows as they lie, [1, L, Hkv, D], causal bottom-right, num_splits N; N=0: the library's own
heuristic), `fa_varlen` (the same through cu_seqlens), `cudnn_prefix` (cuDNN on the keys before
the chunk only, query heads folded into rows, no mask: what a hybrid would pay for the bulk).

    python -m evals.attn_probe
"""
from __future__ import annotations

import json

import torch

from adapters.model import attn_triton as at  # noqa: E402
from evals.attn_kernel import DEV, probe_cases, rel_rms, run_table, sdpa, timed  # noqa: E402
from evals.bench import versions  # noqa: E402

FA = torch.ops.aten._flash_attention_forward


def fa(q, kb, vb, pos, splits):
    t, end = q.shape[0], pos + q.shape[0]
    kw = {"num_splits": splits} if splits else {}
    o = FA(q[None], kb[:end][None], vb[:end][None], None, None, t, end, 0.0, True, False, **kw)[0]
    return o[0].reshape(t, -1)


def fa_varlen(q, kb, vb, pos):
    t, end = q.shape[0], pos + q.shape[0]
    cq = torch.tensor([0, t], device=DEV, dtype=torch.int32)
    ck = torch.tensor([0, end], device=DEV, dtype=torch.int32)
    return FA(q, kb[:end], vb[:end], cq, ck, t, end, 0.0, True, False)[0].reshape(t, -1)


def cudnn_prefix(q, kb, vb, pos):
    t, h, d = q.shape
    hkv = kb.shape[1]
    qf = q.view(t, hkv, h // hkv, d).permute(1, 0, 2, 3).reshape(1, hkv, t * h // hkv, d)
    k = kb[:pos].permute(1, 0, 2)[None]
    v = vb[:pos].permute(1, 0, 2)[None]
    return torch.ops.aten._scaled_dot_product_cudnn_attention(qf, k, v, None, True)[0]


def variants(t):
    out = {"sdpa": sdpa, "fa_varlen": fa_varlen, "ours": None}
    for s in (0, 1, 2, 4, 8, 16, 32):
        out[f"fa_s{s}"] = (lambda s: lambda q, kb, vb, pos: fa(q, kb, vb, pos, s))(s)
    if t > 1:
        out["cudnn_prefix"] = cudnn_prefix
    return out


def measure(name, fn, q, kb, vb, pos, ref):
    """ms, rel RMS vs the fp32 twin (when ref is given), determinism, capacity independence."""
    if name == "ours":
        cfg = at.READ if q.shape[0] > 1 else at.DECODE
        call, o = run_table(q, kb, vb, pos, cfg)
        call()
        a = o.clone()
        call()
        row = {"ms": round(timed(call), 3), "deterministic": bool(torch.equal(a, o))}
        end = pos + q.shape[0]
        small_call, small_o = run_table(q, kb[:end].clone(), vb[:end].clone(), pos, cfg)
        small_call()
        row["capacity_independent"] = bool(torch.equal(small_o, o))
    else:
        call = lambda: fn(q, kb, vb, pos)  # noqa: E731
        a, b = call(), call()
        row = {"ms": round(timed(call), 3), "deterministic": bool(torch.equal(a, b))}
        end = pos + q.shape[0]
        if name != "cudnn_prefix":
            row["capacity_independent"] = bool(torch.equal(
                fn(q, kb[:end].clone(), vb[:end].clone(), pos), a))
        o = a
    if ref is not None and name != "cudnn_prefix":
        row["rel_rms_vs_fp32"] = round(rel_rms(o, ref), 6)
    return row


def main() -> None:
    def measure_case(t, pos, q, kb, vb, ref):
        rows = {}
        for name, fn in variants(t).items():
            try:
                rows[name] = measure(name, fn, q, kb, vb, pos, ref)
            except Exception as e:               # a variant this build refuses: say why
                rows[name] = f"failed: {type(e).__name__}: {e}"[:300]
        return rows

    res = {"shape": [8, 2, 256], **versions(), "cases": probe_cases(620, measure_case)}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
