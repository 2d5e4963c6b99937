"""Attention of a chunk over a session's KV buffer through FlashAttention-2 as torch ships it
(`torch.ops.aten._flash_attention_forward`), called eagerly between the CUDA graphs of a chunk
(model.graphs, attention "flash"); the pure-torch twin is `ref.attend_ref`.

Why this call and not F.scaled_dot_product_attention: it takes the buffer's rows as they lie,
[1, L, Hkv, D] (no permuted copies), grouped query heads natively, and its causal mask is
bottom-right aligned (FlashAttention >= 2.1), what a chunk at positions [pos, pos + T) needs.
Measured on the H200 for one 512-id chunk of random:qwen3.5-0.8b (`evals/attn_probe.py`,
BENCHMARKS.md): 0.16 / 0.30 / 0.47 / 0.89 / 1.34 ms at 8k / 16k / 32k / 64k / 98k context,
against 0.20 / 0.40 / 0.70 / 1.32 / 1.99 for our Triton kernel (attn_triton) and 0.25 / 0.38 /
0.53 / 0.94 / 1.38 for F.scaled_dot_product_attention.

Bits: FlashAttention's forward splits the keys by a heuristic of (batch, heads, T, L, the GPU's
number of SMs) only, so for one GPU model the result is a function of (pos, T, values): never of
the buffer's capacity or of what ran before (checked by evals/attn_probe.py: deterministic and
capacity-independent at every size).
"""
from __future__ import annotations

import torch

# the op's one overload, resolved once (the call between graphs is on the host's critical path)
_FLASH = getattr(getattr(torch.ops.aten, "_flash_attention_forward", None), "default", None)


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where the flash forward can run: CUDA, fp16 or bf16, and this torch has the op."""
    return (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and hasattr(torch.ops.aten, "_flash_attention_forward"))


def attend(q: torch.Tensor, pos: int, k_buf: torch.Tensor, v_buf: torch.Tensor,
           out: torch.Tensor) -> None:
    """Write to out [T, H * D] the causal attention (bottom-right aligned, scale D^-0.5) of
    q [T, H, D] at positions [pos, pos + T) over rows [0, pos + T) of k_buf, v_buf [cap, Hkv, D]
    (contiguous, cap >= pos + T, the chunk's own rows already written). All in the buffers'
    dtype (fp16/bf16, CUDA). Raises RuntimeError from the op for shapes it does not take (D >
    256, say)."""
    t, end = q.shape[0], pos + q.shape[0]
    o = _FLASH(q.contiguous()[None], k_buf[:end][None], v_buf[:end][None], None, None, t, end,
               0.0, True, False)[0]                                  # [1, T, H, D]
    out.copy_(o.view(t, -1))


def write_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                     k_buf: torch.Tensor, v_buf: torch.Tensor, out: torch.Tensor) -> None:
    """Write k, v [T, Hkv, D] to rows [pos, pos + T) of k_buf, v_buf, then `attend`."""
    k_buf[pos:pos + q.shape[0]].copy_(k)
    v_buf[pos:pos + q.shape[0]].copy_(v)
    attend(q, pos, k_buf, v_buf, out)
