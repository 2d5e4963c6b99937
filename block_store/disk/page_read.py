"""The fast read of a page file: DiskStore.read_page's twin that reads the file's `kv` bytes
straight into the caller's buffer (page-locked memory on CUDA) instead of into a tensor of
safetensors' own that is then copied.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON (each tensor's
dtype, shape and [begin, end) byte offsets into the data that follows, and `__metadata__`),
then the data. read_page_into parses the header itself, makes every check DiskStore._load and
read_page make, in the same order and with the same reasons (DiskStore.check_meta: the
metadata's own checksum, format, kind, identity, the tensors' layout; then the offsets, which
safetensors checks when it opens a file; then each tensor's xxh3-64 against its checksum, the
page's key and its ids), and `readinto`s the payload. The reads release the GIL, and so does
the hashing (xxhash 4.1's one-shot digest does; HASH = 'ctypes' calls the same C function
through ctypes, which releases it whatever xxhash's version), so threads read pages in
parallel. tests/unit/test_disk_read.py compares it with read_page on good and damaged files.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct

import numpy as np
import torch
import xxhash

from block_store.disk.files import RefusedFile
from block_store.disk.store import DiskStore

MAX_HEADER = 1 << 20          # bytes of header JSON accepted (ours are a few KB)
HASHES = ("xxhash", "ctypes")
HASH = "xxhash"               # the default of read_page_into's hash_
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def xxh3_ctypes():
    """xxh3-64 hex digests through XXH3_64bits of python-xxhash's own extension, called by
    ctypes (which releases the GIL whatever that xxhash's version does), or None where the
    extension does not export it. The same digests as xxhash.xxh3_64_hexdigest."""
    try:
        from xxhash import _xxhash
        fn = ctypes.CDLL(_xxhash.__file__).XXH3_64bits
    except (ImportError, OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_size_t]

    def hexdigest(a: np.ndarray) -> str:
        return format(fn(a.ctypes.data, a.nbytes), "016x")
    return hexdigest


def _hexdigest_of(hash_: str):
    if hash_ == "ctypes":
        fn = xxh3_ctypes()
        if fn is not None:
            return fn
    return lambda a: xxhash.xxh3_64_hexdigest(a.data)


def read_page_into(disk: DiskStore, key: bytes, ids, out: torch.Tensor,
                   hash_: str | None = None) -> None:
    """Page `key`'s rows into `out` (kv [num_attention, 2, G, Hkv, D], a contiguous CPU tensor
    of the pool's dtype, e.g. a slice of a page-locked buffer), when its file holds the content
    of `ids` (its time renewed: used). Raises RefusedFile with read_page's reasons ('missing',
    'unreadable' for a file that is not whole safetensors or whose kv does not fit `out`,
    'checksum', 'format', an identity field, 'key', 'ids'); `out` then holds anything.
    `hash_` (default HASH): 'xxhash' (xxhash.xxh3_64_hexdigest) or 'ctypes' (xxh3_ctypes,
    where it exists; else xxhash's)."""
    path = disk.page_path(key)
    try:
        f = open(path, "rb", buffering=0)      # noqa: SIM115 (closed below)
    except (FileNotFoundError, IsADirectoryError):
        raise RefusedFile("missing", f"{path.name} is not on disk", path) from None
    except OSError as e:
        raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
    with f:
        try:
            meta, spans, start = _header(f)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
        sums = disk.check_meta(meta, "page", {k: [str(d), s] for k, (d, s, _, _) in
                                              spans.items()}, path)
        kv, id_span = spans.get("kv"), spans.get("ids")
        if kv is None or id_span is None or kv[0] != out.dtype or kv[1] != list(out.shape) \
                or not out.is_contiguous() or id_span[0] != torch.int64 \
                or len(id_span[1]) != 1:
            raise RefusedFile("unreadable", f"{path.name}: not a page of this pool's shape",
                              path)
        got = np.empty(id_span[1][0], dtype=np.int64)
        body = out.view(torch.uint8).numpy().reshape(-1)
        try:
            _read_at(f, start + kv[2], memoryview(body))
            _read_at(f, start + id_span[2], memoryview(got).cast("B"))
        except OSError as e:
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
        digest = _HASH[hash_ or HASH]
        if sums["kv"] != digest(body) or sums["ids"] != digest(got):
            raise RefusedFile("checksum", f"{path.name}: a tensor does not match its checksum",
                              path)
    if meta.get("key") != key.hex():
        raise RefusedFile("key", "the file holds another page", path)
    if got.tolist() != list(ids):
        raise RefusedFile("ids", "the page's ids differ", path)
    disk._used(path)


def whole(path) -> bool:
    """Whether the safetensors file at `path` is there and whole: its size is what its header
    says (8 + the header's length + the data its tensors' offsets tile), read from the
    header alone (one stat and a read of a few KB; no data read, no checksum: a file whose
    bytes are damaged is found when it is read). False for a file that is missing, truncated
    or not of that form."""
    try:
        with open(path, "rb", buffering=0) as f:
            _header(f)
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _header(f) -> tuple[dict[str, str], dict[str, tuple], int]:
    """(metadata, {name: (torch dtype, shape, begin, end)} with offsets from the data's start,
    the data's start) of the safetensors file open as `f`. Raises ValueError (TypeError or
    KeyError for a header of another form) where safetensors would refuse the file: a header
    past MAX_HEADER or the file, not JSON, an unknown dtype, offsets that do not match the
    shape or do not tile the data up to the file's end."""
    size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) != 8:
        raise ValueError("no header length")
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER or 8 + n > size:
        raise ValueError(f"header length {n} past the file ({size} bytes)")
    head = json.loads(f.read(n))
    if not isinstance(head, dict):
        raise TypeError("the header is not a JSON object")
    meta = head.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("metadata values must be strings")
    spans, at = {}, 0
    for name, t in sorted(head.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype, shape, (b, e) = _DTYPES[t["dtype"]], list(t["shape"]), t["data_offsets"]
        if not all(isinstance(d, int) and d >= 0 for d in shape) or b != at or \
                e - b != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"tensor {name!r}: offsets {b}, {e} do not fit {shape}")
        spans[name], at = (dtype, shape, b, e), e
    if 8 + n + at != size:
        raise ValueError(f"the data ends at {8 + n + at}, the file at {size}")
    return meta, spans, 8 + n


def _read_at(f, offset: int, view: memoryview) -> None:
    """Fill `view` from byte `offset` of `f`; OSError when the file ends first."""
    f.seek(offset)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise OSError(f"the file ended {len(view) - done} bytes early")
        done += n


_HASH = {h: _hexdigest_of(h) for h in HASHES}
