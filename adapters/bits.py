"""What a chunk's bits depend on beyond the weights, config, grid and dtype, for the identity
that roots every page key (Adapter.identity, block_store.FileIdentity): the device with its
SM count, the kernels' package versions, and the autotuned kernel picks.

Why each: FA4's key splits are planned from the SM count (model.fa4_plan), so two GPUs of one
name with other SM counts (a MIG slice, a cut-down part) split the keys otherwise; torch,
triton, fla and FA4 releases change the kernels' code; fla's GDN kernels are autotuned per
process (model.autotune: a pick of BK 64 or 32 splits a reduction otherwise), and pinned
picks are only shared by processes that share the pin folder.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import torch

from .model.kernels import KernelSet

PACKAGES = ("triton", "flash-linear-attention", "fla-core")


def device_kind(device: torch.device) -> str:
    """'cpu', or 'cuda:<GPU name> <N> SMs' (torch.cuda.get_device_properties)."""
    if device.type != "cuda":
        return device.type
    props = torch.cuda.get_device_properties(device)
    return f"cuda:{props.name} {props.multi_processor_count} SMs"


def kernel_versions(kernels: KernelSet) -> str:
    """torch's version, and with fla's kernel set the versions of triton and fla installed
    (fla's code is in fla-core since 0.4; 'flash-linear-attention' before), e.g. 'torch
    2.11.0+cu130 triton 3.6.0 fla-core 0.6.0'. FA4's version is in the path tag already."""
    parts = [f"torch {torch.__version__}"]
    if kernels.name == "fla":
        for name in PACKAGES:
            try:
                parts.append(f"{name} {version(name)}")
            except PackageNotFoundError:
                continue
    return " ".join(parts)
