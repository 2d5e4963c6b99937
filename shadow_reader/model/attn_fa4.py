"""Attention of a chunk over a session's KV buffer through FlashAttention-4's CuTe DSL kernels
(the `flash-attn-4` package, `flash_attn.cute`), called eagerly between the CUDA graphs of a
chunk like model.attn_flash (attention "fa4"); the pure-torch twin is `ref.attend_ref`.

Why: on Hopper (SM90) that package's forward is FlashAttention-3's design (wgmma, TMA loads, a
producer warp group feeding two consumer warp groups; Shah et al. 2024) and takes head_dim 256,
where FlashAttention-2 (what torch ships) runs at about 265 TFLOP/s for a 512-id chunk of
random:qwen3.5-0.8b at 16k context on the H200 (BENCHMARKS.md, the profile of 2026-11-29), 39 %
of the chunk. Query heads of one KV group are packed into the rows of one tile (pack_gqa), so a
KV head is loaded once for its group.

Bits: the kernel and its key splits are chosen by the package from (T, L, H, Hkv, D, the GPU's
SM count) only (`num_splits=0`: its heuristic), so for one GPU model the result is a function of
(pos, T, values), never of the buffer's capacity (the rows [0, pos + T) are passed as a slice).
The kernels are compiled at their first call in a process (CuTe DSL JIT, seconds each; cached on
disk when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1).
"""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def _forward():
    """The package's forward entry (flash_attn.cute.interface._flash_attn_fwd: it takes `out`,
    which the public flash_attn_func does not), or None when the package does not import."""
    try:
        from flash_attn.cute.interface import _flash_attn_fwd
    except Exception:                     # not installed, or its CUDA libraries do not load
        return None
    return _flash_attn_fwd


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where the FA4 forward can run: a Hopper GPU (compute capability 9.x, the kernels
    this module was measured with), fp16 or bf16, and flash_attn.cute importable."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if torch.cuda.get_device_capability(device)[0] != 9:
        return False
    return _forward() is not None


def attend(q: torch.Tensor, pos: int, k_buf: torch.Tensor, v_buf: torch.Tensor,
           out: torch.Tensor) -> None:
    """Write to out [T, H * D] (contiguous) the causal attention (bottom-right aligned, scale
    D^-0.5) of q [T, H, D] at positions [pos, pos + T) over rows [0, pos + T) of k_buf, v_buf
    [cap, Hkv, D] (contiguous, cap >= pos + T, the chunk's own rows already written). All in the
    buffers' dtype (fp16/bf16, CUDA). Raises RuntimeError when flash_attn.cute is missing, and
    the package's AssertionError for shapes it does not take (D > 256, say)."""
    fwd = _forward()
    if fwd is None:
        raise RuntimeError("attention 'fa4' needs the flash-attn-4 package (flash_attn.cute)")
    t, h, d = q.shape
    end = pos + t
    fwd(q.contiguous()[None], k_buf[:end][None], v_buf[:end][None], causal=True, num_splits=0,
        out=out.view(1, t, h, d))
