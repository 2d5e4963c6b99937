"""Page keys: the key of the page that ends at grid line L is a chained xxh3-128 over (the key
of the page before it, the page's G ids), rooted in an identity key that covers everything
the page's bits depend on (docs/design.md, "page key").

A page's content is a pure function of its key (the exactness contract restated), so pages can
be shared between sessions and processes and written to disk by key. Keys are deterministic
across processes and machines: no random seed anywhere (vLLM's own chain starts from a root
that is random per process unless PYTHONHASHSEED is set; this one never is). Ids are hashed as
int64 little-endian bytes; a hit still compares the ids before use (`Page.ids`).
"""
from __future__ import annotations

import functools
import json
import struct
from collections.abc import Mapping, Sequence

import xxhash

FORMAT = "shadow-page-key/1"
KEY_BYTES = 16


def identity_key(fields: Mapping[str, object]) -> bytes:
    """The root of every chain for one set of bits: xxh3-128 over FORMAT and `fields` (the
    weights' fingerprint, model config, kernel path and versions, GPU model where kernel
    choices depend on it, grid, dtype, ...), as canonical JSON (sorted keys). 16 bytes.
    Raises TypeError for a value JSON cannot hold."""
    text = json.dumps({"format": FORMAT, **fields}, sort_keys=True, separators=(",", ":"))
    return xxhash.xxh3_128(text.encode()).digest()


def next_key(previous: bytes, page_ids: Sequence[int]) -> bytes:
    """The key of a page: xxh3-128 over the previous page's key (the identity key for the
    first page) and the page's ids as int64 little-endian bytes. 16 bytes."""
    h = xxhash.xxh3_128(previous)
    h.update(_int64_le(len(page_ids)).pack(*page_ids))   # the same bytes on every machine
    return h.digest()


@functools.lru_cache(maxsize=16)
def _int64_le(n: int) -> struct.Struct:
    """n int64 little-endian (a precompiled struct packs a page's ids in about half the time
    array.array('q', ...) takes: evals/page_bookkeeping.py at cadb457)."""
    return struct.Struct(f"<{n}q")


def page_keys(root: bytes, ids: Sequence[int], grid: int, start: int = 0,
              previous: bytes | None = None) -> list[bytes]:
    """Keys of the whole pages of ids[start:], `start` a grid line; `previous` the key of the
    page that ends at `start` (None: start must be 0 and the chain starts at `root`). A partial
    last page gets no key. Raises ValueError for a start off the grid or a missing previous
    key."""
    if start % grid or start < 0:
        raise ValueError(f"start {start} is not a grid line of {grid}")
    if previous is None and start != 0:
        raise ValueError(f"the key of the page ending at {start} is needed to continue")
    key, out = previous if previous is not None else root, []
    for line in range(start, len(ids) - grid + 1, grid):
        key = next_key(key, ids[line:line + grid])
        out.append(key)
    return out
