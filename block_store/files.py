"""Session files: one safetensors file a session, written atomically, checked on the way back.

File layout (format version 1):
- tensors: `ids` int64 [N]; the committed state as layout.pack names it (KV rows gathered
  from the session's pages) (layers.{i}.key /
  .value [C, Hkv, D], layers.{i}.conv [conv_dim, W], layers.{i}.recurrent [HV, K, V] fp32);
  `checkpoints.{j}.layers.{i}.conv` / `.recurrent` per checkpoint j.
- metadata (str -> str): format_version, session (the id), fingerprint, model_config (JSON),
  grid, dtype, device_kind, kernels, committed, checkpoints (JSON [[pos, episode_start, kept],
  ...]), pending_lines (JSON), shared_line, checksums (JSON name -> xxh3-64 hex of the
  tensor's bytes), written_at.
The name is the xxh3-128 hex of the session id (never the raw id): no id reaches a path.
A file that does not fit (format, fingerprint, grid, dtype, device, kernels, a failing checksum,
a truncated file, ids that do not match the tensors) raises RefusedFile with the reason.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash
from safetensors import safe_open
from safetensors.torch import save_file

from .layout import StateSpec, state_names
from .session import SessionState

FORMAT_VERSION = "1"
HASH_THREADS = min(8, os.cpu_count() or 1)
SUFFIX = ".safetensors"


class RefusedFile(Exception):
    """A session file that must not be loaded; `reason` is a short slug, str(e) the details."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class FileIdentity:
    """What a file must match to be loaded (the exactness contract's 'same model, grid, dtype,
    device type and kernels')."""

    fingerprint: str
    model_config: str      # JSON of ModelConfig.to_dict()
    grid: int
    dtype: str
    device_kind: str       # "cpu" or "cuda:<GPU name>"
    kernels: str

    def as_meta(self) -> dict[str, str]:
        return {"fingerprint": self.fingerprint, "model_config": self.model_config,
                "grid": str(self.grid), "dtype": self.dtype, "device_kind": self.device_kind,
                "kernels": self.kernels}


def file_name(session: str) -> str:
    """xxh3-128 hex of the UTF-8 session id + '.safetensors'."""
    return xxhash.xxh3_128(session.encode("utf-8", "surrogatepass")).hexdigest() + SUFFIX


def checksum(t: torch.Tensor) -> str:
    return xxhash.xxh3_64(t.contiguous().view(torch.uint8).numpy().data).hexdigest()


def _tensors(st: SessionState, packed: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {"ids": torch.tensor(st.ids, dtype=torch.int64)}
    # copies, also on the CPU: the KV views share one block (layout.alloc_kv), which
    # safetensors refuses to write as separate tensors
    out.update({k: v.detach().to("cpu", copy=True).contiguous() for k, v in packed.items()})
    gdn_names = [k for k in packed if k.endswith((".conv", ".recurrent"))]
    for j, cp in enumerate(st.checkpoints):
        flat = [t for pair in cp.gdn for t in pair]
        for name, t in zip(gdn_names, flat):
            out[f"checkpoints.{j}.{name}"] = t.detach().to("cpu").contiguous()
    return out


def write_session(directory: Path, session: str, st: SessionState,
                  packed: dict[str, torch.Tensor], ident: FileIdentity) -> tuple[Path, int]:
    """Write one session atomically (temporary file, fsync, rename, fsync of the folder).

    `packed` is layout.pack of the session (KV rows [0, C) only). Returns (path, bytes)."""
    tensors = _tensors(st, packed)
    meta = {"format_version": FORMAT_VERSION, "session": session, **ident.as_meta(),
            "committed": str(st.committed),
            "checkpoints": json.dumps([[cp.pos, cp.episode_start, cp.kept]
                                       for cp in st.checkpoints]),
            "pending_lines": json.dumps(sorted([p, e] for p, e in st.pending_lines.items())),
            "shared_line": str(st.shared_line),
            "checksums": json.dumps({k: checksum(v) for k, v in tensors.items()}),
            "written_at": str(time.time())}
    path = directory / file_name(session)
    atomic_save(tensors, path, meta)
    return path, path.stat().st_size


def atomic_save(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    """safetensors `tensors` with `meta` at `path`, atomically: a temporary file beside it
    (`.NAME.PID.tmp`, swept at start-up), fsync, rename, fsync of the folder."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp), metadata=meta)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _check_meta(meta: dict[str, str], session: str, ident: FileIdentity) -> None:
    if meta.get("format_version") != FORMAT_VERSION:
        raise RefusedFile("format_version", f"{meta.get('format_version')!r} != {FORMAT_VERSION}")
    if meta.get("session") != session:
        raise RefusedFile("session", "the file holds another session")
    for key, want in ident.as_meta().items():
        if meta.get(key) != want:
            raise RefusedFile(key, f"file has {str(meta.get(key))[:80]!r}, reader has "
                                   f"{want[:80]!r}")


def _verify(futures: dict, checksums: dict[str, str]) -> None:
    """Raise RefusedFile unless every tensor's hash (a future) matches its checksum."""
    for name, fut in futures.items():
        if checksums.get(name) != fut.result():
            raise RefusedFile("checksum", f"tensor {name} does not match its checksum")


def read_session(path: Path, session: str, ident: FileIdentity, spec: StateSpec) -> Loaded:
    """Load and check a session file written for states of `spec`.

    Returns its content (Loaded; the GDN states on spec.device). Raises RefusedFile (with the reason) for any file that
    does not fit, including truncated or unreadable files."""
    try:
        with safe_open(str(path), framework="pt") as f:     # tensors map the file, no copy
            meta = f.metadata() or {}
            _check_meta(meta, session, ident)
            checksums = json.loads(meta["checksums"])
            if set(checksums) != set(f.keys()):
                raise RefusedFile("tensors", "the tensors differ from the checksum list")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        # Hash in threads (xxhash releases the GIL) while the tensors are copied to the device;
        # the state is returned only once every checksum matched.
        with ThreadPoolExecutor(HASH_THREADS) as pool:
            futures = {k: pool.submit(checksum, t) for k, t in tensors.items()}
            st = _build_state(meta, tensors, spec)
            _verify(futures, checksums)
        return st
    except RefusedFile:
        raise
    except Exception as e:                 # truncated, not safetensors, bad JSON: all refused
        raise RefusedFile("unreadable", f"{type(e).__name__}: {e}") from e


@dataclass
class Loaded:
    """A session file's content, checked: ids, C, KV rows [0, C) per attention layer (k, v)
    [C, Hkv, D] (on the CPU, mapped from the file), the GDN states at C on the spec's device,
    checkpoints [(pos, GDN states, episode_start, kept)], pending lines, shared line."""

    ids: list[int]
    committed: int
    kv_rows: list[tuple[torch.Tensor, torch.Tensor]]
    gdn: list
    checkpoints: list[tuple[int, list, bool, bool]]
    pending_lines: dict[int, bool]
    shared_line: int


def _build_state(meta, tensors, spec: StateSpec) -> Loaded:
    names, device = state_names(spec), spec.device
    committed = int(meta["committed"])
    ids = tensors["ids"].tolist()
    grid = int(meta["grid"])
    if committed > len(ids) or committed % grid:
        raise RefusedFile("ids", f"committed {committed} does not fit {len(ids)} ids on grid {grid}")
    for name in names:
        if name.endswith((".key", ".value")) and tensors[name].shape[0] != committed:
            raise RefusedFile("ids", f"{name} has {tensors[name].shape[0]} rows, C is {committed}")
    kv_rows = [(tensors[n], tensors[n[:-4] + ".value"]) for n in names if n.endswith(".key")]
    gdn = [(tensors[n].to(device), tensors[n[:-5] + ".recurrent"].to(device))
           for n in names if n.endswith(".conv")]
    cps = []
    for j, row in enumerate(json.loads(meta["checkpoints"])):
        pos, episode, kept = (row + [False])[:3]
        if pos % grid or not 0 < pos <= committed:
            raise RefusedFile("checkpoints", f"checkpoint at {pos} off the grid or above C")
        g = [(tensors[f"checkpoints.{j}.{n}"].to(device),
              tensors[f"checkpoints.{j}.{n[:-5]}.recurrent"].to(device))
             for n in names if n.endswith(".conv")]
        cps.append((int(pos), g, bool(episode), bool(kept)))
    pending = {int(p): bool(e) for p, e in json.loads(meta["pending_lines"])}
    return Loaded(ids, committed, kv_rows, gdn, cps, pending, int(meta.get("shared_line", 0)))


def peek(path: Path, ident: FileIdentity) -> tuple[str, np.ndarray, int] | None:
    """(session, ids, committed) of a file this reader could load, read without its state
    tensors; None for a file of another model, grid, dtype, device or format, or unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format_version") != FORMAT_VERSION or any(
                    meta.get(k) != v for k, v in ident.as_meta().items()):
                return None
            ids = f.get_tensor("ids")
            if json.loads(meta["checksums"]).get("ids") != checksum(ids):
                return None
        return meta["session"], ids.numpy().astype(np.int64), int(meta["committed"])
    except Exception:                       # not ours to judge here: refused if ever used
        return None


def ids_array(ids: list[int]) -> np.ndarray:
    """Compact copy of a parked session's ids (int64)."""
    return np.asarray(ids, dtype=np.int64)
