"""Probe: does SDPA's flash backend take a bottom-right causal mask with GQA (8 query heads over 2
KV heads, head_dim 256) on this GPU, and does it agree with the math backend on expanded heads?"""
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

torch.manual_seed(0)
out = {}
for t, n in ((512, 512), (512, 4096), (37, 4133)):
    q = torch.randn(1, 8, t, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, n, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, n, 256, device="cuda", dtype=torch.bfloat16)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(t, n),
                                               enable_gqa=True)
        with sdpa_kernel([SDPBackend.MATH]):
            r = F.scaled_dot_product_attention(q.float(), k.repeat_interleave(4, 1).float(),
                                               v.repeat_interleave(4, 1).float(),
                                               attn_mask=causal_lower_right(t, n))
        out[f"{t}x{n}"] = (o.float() - r).abs().max().item()
    except Exception as e:                     # report which shapes the backend refuses
        out[f"{t}x{n}"] = f"{type(e).__name__}: {e}"[:300]
print(json.dumps(out))
