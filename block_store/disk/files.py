"""What every file on disk shares: the reader's identity a file must match to be loaded
(FileIdentity), the refusal of a file that does not fit (RefusedFile, with its reason), the
tensors' checksums (xxh3-64), and atomic writes. The files themselves (pages, GDN entries,
manifests) are disk.DiskStore's.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
from safetensors.torch import save_file


class RefusedFile(Exception):
    """A file that must not be loaded; `reason` is a short slug, str(e) the details, `path`
    the file (when known)."""

    def __init__(self, reason: str, detail: str, path: Path | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.path = reason, path


@dataclass(frozen=True)
class FileIdentity:
    """What a file must match to be loaded, and the root of every page key (keys.identity_key
    of `as_meta()`): everything a chunk's bits depend on (the exactness contract's 'same
    model, grid, dtype, device and kernels')."""

    fingerprint: str
    model_config: str      # JSON of ModelConfig.to_dict()
    grid: int
    dtype: str
    device_kind: str       # "cpu" or "cuda:<GPU name> <N> SMs" (FA4's key splits use N)
    kernels: str           # kernel set and path tag, e.g. "fla graphs:fa4 ... +fused+proj"
    versions: str = ""     # adapters.bits.kernel_versions: packages and fla's switches
    picks: str = "none"    # digest of the autotuned kernel picks (adapters.model.picks)

    def as_meta(self) -> dict[str, str]:
        return {"fingerprint": self.fingerprint, "model_config": self.model_config,
                "grid": str(self.grid), "dtype": self.dtype, "device_kind": self.device_kind,
                "kernels": self.kernels, "versions": self.versions, "picks": self.picks}


def checksum(t: torch.Tensor) -> str:
    return xxhash.xxh3_64(t.contiguous().view(torch.uint8).numpy().data).hexdigest()


def atomic_save(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str],
                durable: bool = True) -> None:
    """safetensors `tensors` with `meta` at `path`, atomically: a temporary file beside it
    (`.NAME.PID-THREAD.tmp`, removed at start-up once its writer is gone), fsync, rename,
    fsync of the folder. Raises OSError when it cannot be written (safetensors' own errors
    included), leaving no temporary behind. Two writers of one path each rename a whole file.
    `durable=False`
    skips both fsyncs: the file is whole for every process (a rename), but a power loss may
    leave it empty or partial; only for files checked by checksum when read (pages, GDN
    entries), never for what a restart trusts without them (manifests)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp"
    path.parent.mkdir(parents=True, exist_ok=True)        # a folder removed while running
    try:
        save_file(tensors, str(tmp), metadata=meta)
    except Exception as e:   # safetensors' own error for a full disk or a folder gone
        tmp.unlink(missing_ok=True)
        raise e if isinstance(e, OSError) else OSError(f"{path.name}: {e}") from e
    if not durable:
        os.replace(tmp, path)
        return
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def difference(name: str, theirs: str | None, ours: str) -> str:
    """Why a file's identity field `name` is not this reader's: for a JSON object (the model
    config) the keys that differ with both values, else both values (each cut at 80
    characters)."""
    try:
        a, b = json.loads(theirs), json.loads(ours)
    except (TypeError, ValueError):
        a = b = None
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        shown = "; ".join(f"{k}: {a.get(k)!r} here {b.get(k)!r}" for k in keys[:5])
        more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
        return f"the file's {name} differs from this reader's in {shown}{more}"
    return f"the file's {name} is {str(theirs)[:80]!r}, this reader's {str(ours)[:80]!r}"
