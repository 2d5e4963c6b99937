"""The content-addressed disk tier (issue 16, item 6; first part, not yet used by the reader):
pages and GDN entries in files named by their key, each written once and found by key by any
reader that shares the folder, and one manifest a session.

Layout under the folder D (format version `FORMAT`):
- D/pages/<key hex>.safetensors: `k`, `v` [num_attention, G, Hkv, D] (the page's rows of
  every attention layer, the pool's dtype), `ids` int64 [G];
- D/gdn/<key hex>.safetensors: `layers.{j}.conv` [conv_dim, W] and `layers.{j}.recurrent`
  [HV, K, V] fp32 per GDN layer j (the states after the page that ends at `line`);
- D/sessions/<xxh3-128 hex of the session id>.safetensors: `ids` int64 [N] (a manifest).
Every file's metadata holds the format, its kind, the reader's identity (files.FileIdentity)
and xxh3-64 checksums of its tensors; pages and entries their key, entries their line and
kind; manifests what `Manifest` holds. A page's content is a pure function of its key (the
exactness contract restated), so a file that exists is never written again. Writes are atomic
(files.atomic_save). A file that does not fit (another identity or format, a key or ids that
differ, a failing checksum, a truncated file) raises files.RefusedFile with the reason.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open

from .files import FileIdentity, RefusedFile, atomic_save, checksum
from .layout import GdnState

FORMAT = "shadow-disk/1"
SUFFIX = ".safetensors"


@dataclass
class Manifest:
    """What a restart trusts for one session: its ids, C, the keys of its pages [0, C) (hex),
    the key of the GDN entry holding its state at C (None at C = 0), its checkpoints
    [(line, entry key hex, episode_start, kept)], pending lines {line: episode_start}, the
    shared line, and when it was written (s since the epoch)."""

    ids: list[int]
    committed: int
    page_keys: list[str]
    state_key: str | None
    checkpoints: list[tuple[int, str, bool, bool]] = field(default_factory=list)
    pending_lines: dict[int, bool] = field(default_factory=dict)
    shared_line: int = 0
    written_at: float = 0.0


class DiskStore:
    """Files by key under `root` for readers of identity `ident`. Creates the folders."""

    def __init__(self, root: Path, ident: FileIdentity):
        self.root, self.ident = Path(root).expanduser(), ident
        for sub in ("pages", "gdn", "sessions"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # -- paths ----------------------------------------------------------------------------------
    def page_path(self, key: bytes) -> Path:
        return self.root / "pages" / (key.hex() + SUFFIX)

    def entry_path(self, key: bytes) -> Path:
        return self.root / "gdn" / (key.hex() + SUFFIX)

    def manifest_path(self, session: str) -> Path:
        name = xxhash.xxh3_128(session.encode("utf-8", "surrogatepass")).hexdigest()
        return self.root / "sessions" / (name + SUFFIX)

    def has_page(self, key: bytes) -> bool:
        return self.page_path(key).is_file()

    def has_entry(self, key: bytes) -> bool:
        return self.entry_path(key).is_file()

    # -- writing --------------------------------------------------------------------------------
    def _meta(self, kind: str, tensors: dict[str, torch.Tensor], **extra) -> dict[str, str]:
        return {"format": FORMAT, "kind": kind, **self.ident.as_meta(),
                **{k: str(v) for k, v in extra.items()},
                "checksums": json.dumps({k: checksum(v) for k, v in tensors.items()})}

    def write_page(self, key: bytes, ids, k: torch.Tensor, v: torch.Tensor) -> bool:
        """The page `key` (rows k, v [num_attention, G, Hkv, D], from `ids`), unless its file
        exists. Returns whether it was written."""
        path = self.page_path(key)
        if path.is_file():
            return False
        tensors = {"k": k.detach().to("cpu").contiguous(), "v": v.detach().to("cpu").contiguous(),
                   "ids": torch.tensor(list(ids), dtype=torch.int64)}
        atomic_save(tensors, path, self._meta("page", tensors, key=key.hex()))
        return True

    def write_entry(self, key: bytes, line: int, states: GdnState, kind: str) -> bool:
        """The GDN entry `key` at `line` (per GDN layer (conv, recurrent)), unless its file
        exists. Returns whether it was written."""
        path = self.entry_path(key)
        if path.is_file():
            return False
        tensors = {}
        for j, (conv, rec) in enumerate(states):
            tensors[f"layers.{j}.conv"] = conv.detach().to("cpu").contiguous()
            tensors[f"layers.{j}.recurrent"] = rec.detach().to("cpu").contiguous()
        atomic_save(tensors, path, self._meta("gdn", tensors, key=key.hex(), line=line,
                                              entry_kind=kind))
        return True

    def write_manifest(self, session: str, m: Manifest) -> Path:
        """The session's manifest, replacing the one before (atomically)."""
        tensors = {"ids": torch.tensor(m.ids, dtype=torch.int64)}
        meta = self._meta("manifest", tensors, session=session, committed=m.committed,
                          page_keys=json.dumps(m.page_keys), state_key=m.state_key or "",
                          checkpoints=json.dumps([list(c) for c in m.checkpoints]),
                          pending_lines=json.dumps(sorted([p, e]
                                                          for p, e in m.pending_lines.items())),
                          shared_line=m.shared_line, written_at=time.time())
        path = self.manifest_path(session)
        atomic_save(tensors, path, meta)
        return path

    # -- reading --------------------------------------------------------------------------------
    def _load(self, path: Path, kind: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
        """(metadata, tensors) of a file of `kind` that fits this reader; RefusedFile else."""
        if not path.is_file():
            raise RefusedFile("missing", f"{path.name} is not on disk")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:           # truncated, not safetensors: refused, with the reason
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}") from e
        if meta.get("format") != FORMAT or meta.get("kind") != kind:
            raise RefusedFile("format", f"{meta.get('format')!r} {meta.get('kind')!r}, "
                                        f"expected {FORMAT!r} {kind!r}")
        for name, want in self.ident.as_meta().items():
            if meta.get(name) != want:
                raise RefusedFile(name, f"the file's {name} differs from this reader's")
        sums = json.loads(meta.get("checksums", "{}"))
        if set(sums) != set(tensors) or any(sums[k] != checksum(t) for k, t in tensors.items()):
            raise RefusedFile("checksum", f"{path.name}: a tensor does not match its checksum")
        return meta, tensors

    def read_page(self, key: bytes, ids) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) [num_attention, G, Hkv, D] of page `key` on the CPU, when its file holds the
        content of `ids`. Raises RefusedFile (reason 'missing' when there is no file, 'key' or
        'ids' when it holds another content)."""
        meta, t = self._load(self.page_path(key), "page")
        if meta.get("key") != key.hex():
            raise RefusedFile("key", "the file holds another page")
        if t["ids"].tolist() != list(ids):
            raise RefusedFile("ids", "the page's ids differ")
        return t["k"], t["v"]

    def read_entry(self, key: bytes) -> tuple[int, GdnState, str]:
        """(line, states per GDN layer (conv, recurrent) on the CPU, kind) of entry `key`.
        Raises RefusedFile as read_page."""
        meta, t = self._load(self.entry_path(key), "gdn")
        if meta.get("key") != key.hex():
            raise RefusedFile("key", "the file holds another entry")
        n = len(t) // 2
        states = [(t[f"layers.{j}.conv"], t[f"layers.{j}.recurrent"]) for j in range(n)]
        return int(meta["line"]), states, meta.get("entry_kind", "checkpoint")

    def read_manifest(self, session: str) -> Manifest:
        """The session's manifest. Raises RefusedFile ('missing' without one, 'session' when
        the file names another session, 'manifest' when C does not fit its ids, pages and
        state key)."""
        meta, t = self._load(self.manifest_path(session), "manifest")
        if meta.get("session") != session:
            raise RefusedFile("session", "the manifest holds another session")
        try:
            m = Manifest(
                ids=t["ids"].tolist(), committed=int(meta["committed"]),
                page_keys=json.loads(meta["page_keys"]), state_key=meta["state_key"] or None,
                checkpoints=[(int(p), str(k), bool(e), bool(kp))
                             for p, k, e, kp in json.loads(meta["checkpoints"])],
                pending_lines={int(p): bool(e) for p, e in json.loads(meta["pending_lines"])},
                shared_line=int(meta["shared_line"]), written_at=float(meta["written_at"]))
        except (KeyError, ValueError, TypeError) as e:
            raise RefusedFile("manifest", f"{type(e).__name__}: {e}") from e
        grid = self.ident.grid
        if m.committed % grid or not 0 <= m.committed <= len(m.ids) or \
                len(m.page_keys) != m.committed // grid or (m.committed > 0) != bool(m.state_key):
            raise RefusedFile("manifest", f"C {m.committed} does not fit {len(m.ids)} ids, "
                                          f"{len(m.page_keys)} pages and the state key")
        return m
