"""What a chunk's bits depend on beyond the weights, config, grid and dtype, for the identity
that roots every page key (Adapter.identity, block_store.FileIdentity): the device with its
SM count, the kernels' package versions, and the autotuned kernel picks.

Why each: FA4's key splits are planned from the SM count (attention.fa4_plan), so two GPUs of one
name with other SM counts (a MIG slice, a cut-down part) split the keys otherwise; torch,
triton, fla and FA4 releases change the kernels' code; fla's GDN kernels are autotuned per
process (model.autotune: a pick of BK 64 or 32 splits a reduction otherwise), and so are
torch inductor's compiled small ops: their picks are digested (model.picks), pinned picks
being shared only by processes that share the pin folder. Not covered: the CPU's
instruction set on the CPU path.
"""
from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

import torch

from adapters.model import ref
from adapters.model.kernels import KernelSet

# packages whose code runs in a chunk with fla's kernel set, each (name, fallbacks): fla's
# kernels are in fla-core since 0.4 (flash-linear-attention is then a shell that requires it,
# so naming it too would split identities for nothing); cuBLAS may be upgraded apart from torch
PACKAGES = (("triton",), ("fla-core", "flash-linear-attention"),
            ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"))
# fla's switches read from the environment that change its kernels' arithmetic
FLA_SWITCHES = ("FLA_USE_FAST_OPS", "FLA_TRIL_PRECISION", "FLA_FLASH_QLA")


def device_kind(device: torch.device) -> str:
    """'cpu', or 'cuda:<GPU name> <N> SMs' (torch.cuda.get_device_properties)."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return f"cuda:{props.name} {props.multi_processor_count} SMs"


def kernel_versions(kernels: KernelSet, env=None) -> str:
    """torch's version (with the pure-torch kernel set, also ref.REVISION: 'ref 2'), and
    with fla's kernel set the versions of triton, fla and cuBLAS
    installed (the first of each PACKAGES entry found) and fla's switches as set in `env`
    (default os.environ; 'unset' when not), e.g. 'torch 2.11.0+cu130 triton 3.6.0 fla-core
    0.6.0 nvidia-cublas 13.1.0 FLA_USE_FAST_OPS=unset ...'. FA4's and its compiler's versions
    are in the path tag already; the autotuned picks are in the identity's `picks`."""
    parts = [f"torch {torch.__version__}"]
    if kernels.name != "fla":                     # the pure-torch kernels' own revision
        return f"{parts[0]} ref {ref.REVISION}"
    env = os.environ if env is None else env
    for names in PACKAGES:
        found = next((f"{n} {v}" for n in names if (v := _version(n)) is not None), None)
        if found is not None:
            parts.append(found)
    parts += [f"{k}={env.get(k, 'unset')}" for k in FLA_SWITCHES]
    return " ".join(parts)


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None
