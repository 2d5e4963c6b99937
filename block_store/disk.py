"""The content-addressed disk tier: pages and GDN entries in files named by their key, each
written once and found by key by any reader that shares the folder, and one manifest a
session (what a restart trusts).

Layout under the folder D (format version `FORMAT`):
- D/pages/<key hex>.safetensors: `kv` [num_attention, 2, G, Hkv, D] (the page's K and V rows
  of every attention layer, the pool's dtype), `ids` int64 [G];
- D/gdn/<key hex>.safetensors: `layers.{j}.conv` [conv_dim, W] and `layers.{j}.recurrent`
  [HV, K, V] fp32 per GDN layer j (the states after the page that ends at `line`);
- D/sessions/<xxh3-128 hex of the session id>.safetensors: `ids` int64 [N] (a manifest).
Every file's metadata holds the format, its kind, the reader's identity (files.FileIdentity)
and xxh3-64 checksums of its tensors; pages and entries their key, entries their line and
kind; manifests what `Manifest` holds. A page's content is a pure function of its key (the
exactness contract restated), so a file that exists is never written again. Writes are atomic
(files.atomic_save). A file that does not fit (another identity or format, a key or ids that
differ, a failing checksum, a truncated file) raises files.RefusedFile with the reason;
`set_aside` moves it to D/refused/. `sweep` keeps the folder within its TTL and byte cap.
"""
from __future__ import annotations

import json
import os
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
    """Files by key under `root` for readers of identity `ident`. Creates the folders and
    removes the temporary files of writers that died (their process is gone)."""

    def __init__(self, root: Path, ident: FileIdentity):
        self.root, self.ident = Path(root).expanduser(), ident
        self.refusals: dict[str, int] = {}          # files set aside, by reason
        for sub in ("pages", "gdn", "sessions"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            for tmp in (self.root / sub).glob(".*.tmp"):
                if not _alive(tmp):
                    tmp.unlink(missing_ok=True)

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

    def write_page(self, key: bytes, ids, kv: torch.Tensor, durable: bool = False) -> bool:
        """The page `key` (rows kv [num_attention, 2, G, Hkv, D], from `ids`), unless its file
        exists (then only its time is renewed, for the TTL). Returns whether it was written.
        Not fsynced unless `durable` (files.atomic_save): a page a power loss damaged fails its
        checksum when read and is set aside, and the session resumes below it."""
        path = self.page_path(key)
        if _renew(path):
            return False
        tensors = {"kv": kv.detach().to("cpu").contiguous(),
                   "ids": torch.tensor(list(ids), dtype=torch.int64)}
        atomic_save(tensors, path, self._meta("page", tensors, key=key.hex()), durable)
        return True

    def write_entry(self, key: bytes, line: int, states: GdnState, kind: str,
                    durable: bool = False) -> bool:
        """The GDN entry `key` at `line` (per GDN layer (conv, recurrent)), unless its file
        exists. Returns whether it was written. Not fsynced unless `durable`, as pages."""
        path = self.entry_path(key)
        if _renew(path):
            return False
        tensors = {}
        for j, (conv, rec) in enumerate(states):
            tensors[f"layers.{j}.conv"] = conv.detach().to("cpu").contiguous()
            tensors[f"layers.{j}.recurrent"] = rec.detach().to("cpu").contiguous()
        atomic_save(tensors, path, self._meta("gdn", tensors, key=key.hex(), line=line,
                                              entry_kind=kind), durable)
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
            raise RefusedFile("missing", f"{path.name} is not on disk", path)
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as e:           # truncated, not safetensors: refused, with the reason
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
        if meta.get("format") != FORMAT or meta.get("kind") != kind:
            raise RefusedFile("format", f"{meta.get('format')!r} {meta.get('kind')!r}, "
                                        f"expected {FORMAT!r} {kind!r}", path)
        for name, want in self.ident.as_meta().items():
            if meta.get(name) != want:
                raise RefusedFile(name, f"the file's {name} differs from this reader's", path)
        sums = json.loads(meta.get("checksums", "{}"))
        if set(sums) != set(tensors) or any(sums[k] != checksum(t) for k, t in tensors.items()):
            raise RefusedFile("checksum", f"{path.name}: a tensor does not match its checksum",
                              path)
        return meta, tensors

    def read_page(self, key: bytes, ids) -> torch.Tensor:
        """kv [num_attention, 2, G, Hkv, D] of page `key` on the CPU, when its file holds the
        content of `ids`. Raises RefusedFile (reason 'missing' when there is no file, 'key' or
        'ids' when it holds another content)."""
        path = self.page_path(key)
        meta, t = self._load(path, "page")
        if meta.get("key") != key.hex():
            raise RefusedFile("key", "the file holds another page", path)
        if t["ids"].tolist() != list(ids):
            raise RefusedFile("ids", "the page's ids differ", path)
        return t["kv"]

    def read_entry(self, key: bytes) -> tuple[int, GdnState, str]:
        """(line, states per GDN layer (conv, recurrent) on the CPU, kind) of entry `key`.
        Raises RefusedFile as read_page."""
        path = self.entry_path(key)
        meta, t = self._load(path, "gdn")
        if meta.get("key") != key.hex():
            raise RefusedFile("key", "the file holds another entry", path)
        n = len(t) // 2
        states = [(t[f"layers.{j}.conv"], t[f"layers.{j}.recurrent"]) for j in range(n)]
        return int(meta["line"]), states, meta.get("entry_kind", "checkpoint")

    def read_manifest(self, session: str) -> Manifest:
        """The session's manifest. Raises RefusedFile ('missing' without one, 'session' when
        the file names another session, 'manifest' when C does not fit its ids, pages and
        state key)."""
        path = self.manifest_path(session)
        found, m = self.read_manifest_file(path)
        if found != session:
            raise RefusedFile("session", "the manifest holds another session", path)
        return m

    def read_manifest_file(self, path: Path) -> tuple[str, Manifest]:
        """(session, manifest) of the manifest at `path`, whose name must be its session's.
        Raises RefusedFile as read_manifest."""
        meta, t = self._load(path, "manifest")
        session = meta.get("session", "")
        if path != self.manifest_path(session):
            raise RefusedFile("session", "the manifest's name is not its session's", path)
        try:
            m = Manifest(
                ids=t["ids"].tolist(), committed=int(meta["committed"]),
                page_keys=json.loads(meta["page_keys"]), state_key=meta["state_key"] or None,
                checkpoints=[(int(p), str(k), bool(e), bool(kp))
                             for p, k, e, kp in json.loads(meta["checkpoints"])],
                pending_lines={int(p): bool(e) for p, e in json.loads(meta["pending_lines"])},
                shared_line=int(meta["shared_line"]), written_at=float(meta["written_at"]))
        except (KeyError, ValueError, TypeError) as e:
            raise RefusedFile("manifest", f"{type(e).__name__}: {e}", path) from e
        grid = self.ident.grid
        if m.committed % grid or not 0 <= m.committed <= len(m.ids) or \
                len(m.page_keys) != m.committed // grid or (m.committed > 0) != bool(m.state_key):
            raise RefusedFile("manifest", f"C {m.committed} does not fit {len(m.ids)} ids, "
                                          f"{len(m.page_keys)} pages and the state key", path)
        return session, m

    def manifests(self) -> list[Path]:
        """The manifest files in the folder, oldest first."""
        return [p for p, _ in _files(self.root / "sessions")]

    # -- upkeep ---------------------------------------------------------------------------------
    def set_aside(self, path: Path | None, reason: str) -> None:
        """Move a refused file to D/refused/ (named with its folder, the reason and the time)
        and count it under the reason in `refusals`; nothing for a file already gone (deleted
        or set aside by another reader)."""
        if path is None or not path.is_file():
            return
        aside = self.root / "refused"
        aside.mkdir(exist_ok=True)
        try:
            path.replace(aside / f"{path.parent.name}.{path.stem}.{reason}.{int(time.time())}"
                                 f"{path.suffix}")
        except FileNotFoundError:
            return
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def sweep(self, ttl_s: float, cap_bytes: int | None, keep: set[Path] = frozenset()
              ) -> list[Path]:
        """Delete files older than `ttl_s`, then, past `cap_bytes`, the oldest pages and GDN
        entries, then the oldest manifests; never those in `keep`. A file's time is renewed
        whenever it is written again or used. Returns the deleted paths."""
        now, gone = time.time(), []
        files = {sub: _files(self.root / sub) for sub in ("pages", "gdn", "sessions")}
        total = sum(st.st_size for fs in files.values() for _, st in fs)
        order = sorted(files["pages"] + files["gdn"], key=lambda f: f[1].st_mtime) + \
            files["sessions"]
        for path, st in order:
            expired = now - st.st_mtime > ttl_s
            over = cap_bytes is not None and total > cap_bytes
            if path not in keep and (expired or over):
                path.unlink(missing_ok=True)
                total -= st.st_size
                gone.append(path)
        return gone

    def counts(self) -> dict[str, int]:
        """Files held: pages, GDN entries, manifests, and their bytes."""
        files = {sub: _files(self.root / sub) for sub in ("pages", "gdn", "sessions")}
        return {"pages": len(files["pages"]), "gdn_entries": len(files["gdn"]),
                "manifests": len(files["sessions"]),
                "bytes": sum(st.st_size for fs in files.values() for _, st in fs)}


def _alive(tmp: Path) -> bool:
    """Whether the writer of a temporary file (files.atomic_save: `.NAME.PID-THREAD.tmp`)
    still runs on this machine."""
    try:
        os.kill(int(tmp.name.rsplit(".", 2)[-2].split("-")[0]), 0)
        return True
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:              # another user's process
        return True


def _renew(path: Path) -> bool:
    """Whether `path` exists; its time is renewed when it does (the TTL counts from the last
    use)."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False


def _files(folder: Path) -> list[tuple[Path, os.stat_result]]:
    """(path, stat) of the finished files in `folder` (no temporaries), oldest first."""
    out = []
    with os.scandir(folder) as it:
        for e in it:
            if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                try:
                    out.append((Path(e.path), e.stat()))
                except FileNotFoundError:    # deleted meanwhile by another reader
                    pass
    return sorted(out, key=lambda f: f[1].st_mtime)
