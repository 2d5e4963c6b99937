"""The content-addressed disk tier: pages and GDN entries in files named by their key, each
written once and found by key by any reader that shares the folder, and one manifest a
session (what a restart trusts).

Layout under the folder D (format version `FORMAT`):
- D/pages/<key hex>.safetensors: `kv` [num_attention, 2, G, Hkv, D] (the page's K and V rows
  of every attention layer, the pool's dtype), `ids` int64 [G];
- D/gdn/<key hex>.safetensors: `layers.{j}.conv` [conv_dim, W] and `layers.{j}.recurrent`
  [HV, K, V] fp32 per GDN layer j (the states after the page that ends at `line`);
- D/sessions/<identity key hex>/<xxh3-128 hex of the session id>.safetensors: `ids` int64
  [N] (a manifest; one subfolder a reader identity, so readers of other models, grids or
  kernels on the folder never see, refuse or set aside each other's manifests).
Every file's metadata holds the format, its kind, the reader's identity (files.FileIdentity),
xxh3-64 checksums of its tensors, their dtypes and shapes, and a checksum of the metadata
itself; pages and entries their key, entries their line and kind; manifests what
manifest.Manifest holds. A page's content is a pure function of its key (the exactness
contract restated), so a file that exists is never written again (its time is renewed when it
is used). Writes are atomic (files.atomic_save). A file that does not fit (another identity
or format, a key or ids that differ, a failing checksum, damaged metadata, a truncated file)
raises files.RefusedFile with the reason; `set_aside` moves it to D/refused/. Upkeep (TTL,
cap, counts, temporaries): upkeep.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import xxhash
from safetensors import safe_open

from block_store.disk import upkeep
from block_store.disk.files import FileIdentity, RefusedFile, atomic_save, checksum, difference
from block_store.disk.manifest import Manifest, Superseded, from_meta, peek_mark, to_meta
from block_store.memory.keys import identity_key
from block_store.memory.layout import GdnState

FORMAT = "shadow-disk/1"
SUFFIX = upkeep.SUFFIX
INDEX_MAX_AGE_S = 10.0    # the GDN entry index and the counts list the folder again this often


class DiskStore:
    """Files by key under `root` for readers of identity `ident`. Creates the folders and
    removes the temporary files of writers that died. Keeps an index of the GDN entries on
    disk and the folder's counts, listed again every INDEX_MAX_AGE_S and kept up to date with
    this process's own writes (another process's appear within that time)."""

    def __init__(self, root: Path, ident: FileIdentity):
        self.root, self.ident = Path(root).expanduser(), ident
        self.manifest_dir = self.root / "sessions" / identity_key(ident.as_meta()).hex()
        self.refusals: dict[str, int] = {}          # files set aside, by reason
        self.writer = writer_token()     # this store's token in its manifests (Manifest.writer)
        for folder in (self.root / "pages", self.root / "gdn", self.manifest_dir):
            folder.mkdir(parents=True, exist_ok=True)
            upkeep.clear_temporaries(folder)
        self._entries: set[bytes] = set()
        self._pages: set[bytes] = set()
        # the indexes' writes and listings (writers run in the spill's threads); the keys this
        # process wrote while a listing ran, which the listing may have missed (None: none runs)
        self._index_lock = threading.Lock()
        self._during: set[tuple[str, bytes]] | None = None
        self._counts: dict[str, int] = {}
        self._listed_at = -INDEX_MAX_AGE_S

    # -- paths and lookups ----------------------------------------------------------------------
    def page_path(self, key: bytes) -> Path:
        return self.root / "pages" / (key.hex() + SUFFIX)

    def entry_path(self, key: bytes) -> Path:
        return self.root / "gdn" / (key.hex() + SUFFIX)

    def manifest_path(self, session: str) -> Path:
        name = xxhash.xxh3_128(session.encode("utf-8", "surrogatepass")).hexdigest()
        return self.manifest_dir / (name + SUFFIX)

    def has_page(self, key: bytes) -> bool:
        """Whether page `key`'s file exists (one stat)."""
        return self.page_path(key).is_file()

    def keep_page(self, key: bytes) -> bool:
        """Whether page `key`'s file exists; its time is renewed when it does (a spill that
        finds it need not write it, and the TTL counts from now)."""
        there = upkeep.renew(self.page_path(key))
        if there:
            self._note("pages", key)
        return there

    def has_entry(self, key: bytes, look: bool = False) -> bool:
        """Whether entry `key` is on disk, by the index (no stat); with `look`, a file the
        index does not know yet (another process wrote it since the last listing) is looked
        for (one stat)."""
        self._relist()
        if key not in self._entries and look and self.entry_path(key).is_file():
            self._note("gdn", key)
        return key in self._entries

    def page_listed(self, key: bytes) -> bool:
        """Whether page `key` is in the folder's listing (no stat: listed at most every
        INDEX_MAX_AGE_S, with this process's own writes; another process's appear within that
        time, and a file deleted since may still be counted): what status reports, not what
        a resume trusts (has_page)."""
        self._relist()
        return key in self._pages

    def counts(self) -> dict[str, int]:
        """Files held: pages, GDN entries, this identity's manifests, and every file's bytes
        (listed at most every INDEX_MAX_AGE_S, with this process's writes counted since)."""
        self._relist()
        return dict(self._counts)

    def refresh(self) -> None:
        """List the folder again when half INDEX_MAX_AGE_S old, so that lookups and counts
        made under a caller's lock do not list it. Safe from another thread than the one
        writing: the listing replaces the index and counts whole (a write counted meanwhile
        may be missed until the next listing)."""
        self._relist(max_age_s=INDEX_MAX_AGE_S / 2)

    def _relist(self, force: bool = False, max_age_s: float = INDEX_MAX_AGE_S) -> None:
        if force or time.monotonic() - self._listed_at > max_age_s:
            with self._index_lock:
                self._during = set()
            listed = upkeep.listing(self.root)
            counts = upkeep.counts(listed, self.manifest_dir)
            with self._index_lock:          # what this process wrote meanwhile stays listed
                during, self._during = self._during, None
                self._entries = _keys(listed["gdn"]) | {k for d, k in during if d == "gdn"}
                self._pages = _keys(listed["pages"]) | {k for d, k in during if d == "pages"}
            self._counts = counts
            self._listed_at = time.monotonic()

    def _note(self, kind: str, key: bytes, there: bool = True) -> None:
        """Index `key` ('pages' or 'gdn') as on disk (`there`) or not, also in a listing
        running in another thread."""
        with self._index_lock:
            index = self._pages if kind == "pages" else self._entries
            (index.add if there else index.discard)(key)
            if self._during is not None:
                (self._during.add if there else self._during.discard)((kind, key))

    def _wrote(self, kind: str, path: Path, before: int = 0) -> None:
        if self._counts:
            self._counts[kind] += 1 if not before else 0
            self._counts["bytes"] += path.stat().st_size - before

    # -- writing --------------------------------------------------------------------------------
    def _meta(self, kind: str, tensors: dict[str, torch.Tensor], **extra) -> dict[str, str]:
        meta = {"format": FORMAT, "kind": kind, **self.ident.as_meta(),
                **{k: str(v) for k, v in extra.items()},
                "checksums": json.dumps({k: checksum(v) for k, v in tensors.items()}),
                "layout": json.dumps(_layout(tensors))}
        meta["meta_checksum"] = _meta_checksum(meta)
        return meta

    def write_page(self, key: bytes, ids, kv: torch.Tensor, durable: bool = False) -> bool:
        """The page `key` (rows kv [num_attention, 2, G, Hkv, D], from `ids`), unless its file
        exists (then only its time is renewed, for the TTL). Returns whether it was written.
        Not fsynced unless `durable` (files.atomic_save): a page a power loss damaged fails its
        checksum when read and is set aside, and the session resumes below it. Raises OSError
        when the file cannot be written."""
        path = self.page_path(key)
        if upkeep.renew(path):
            self._note("pages", key)
            return False
        tensors = {"kv": kv.detach().to("cpu").contiguous(),
                   "ids": torch.tensor(list(ids), dtype=torch.int64)}
        atomic_save(tensors, path, self._meta("page", tensors, key=key.hex()), durable)
        self._note("pages", key)
        self._wrote("pages", path)
        return True

    def write_entry(self, key: bytes, line: int, states: GdnState, kind: str,
                    durable: bool = False) -> bool:
        """The GDN entry `key` at `line` (per GDN layer (conv, recurrent)), unless its file
        exists. Returns whether it was written. Not fsynced unless `durable`, as pages."""
        path = self.entry_path(key)
        if upkeep.renew(path):
            self._note("gdn", key)
            return False
        tensors = {}
        for j, (conv, rec) in enumerate(states):
            tensors[f"layers.{j}.conv"] = conv.detach().to("cpu").contiguous()
            tensors[f"layers.{j}.recurrent"] = rec.detach().to("cpu").contiguous()
        atomic_save(tensors, path, self._meta("gdn", tensors, key=key.hex(), line=line,
                                              entry_kind=kind), durable)
        self._note("gdn", key)
        self._wrote("gdn_entries", path)
        return True

    def write_manifest(self, session: str, m: Manifest,
                       expect: tuple[str, int] | None = None) -> Path:
        """The session's manifest, replacing the one before (atomically, fsynced) when that
        one is the version `expect` ((writer, seq), Manifest.mark: the one this process last
        wrote or read; None: none) or there is none; `m` gets this process's writer token and
        the version one past it. The compare and the rename are made under the manifests'
        lock (flock on the identity's folder's `.lock`), so of two processes writing one
        session one wins and the other learns of it. Raises Superseded when the folder holds
        another version (nothing is written), OSError when it cannot be written."""
        path = self.manifest_path(session)
        with self._manifest_lock():
            found = peek_mark(path)
            if found is not None and found != expect:
                raise Superseded(session, found)
            m.writer, m.seq = self.writer, max(expect[1] if expect else 0,
                                               found[1] if found else 0) + 1
            tensors = {"ids": torch.tensor(m.ids, dtype=torch.int64)}
            meta = self._meta("manifest", tensors, **to_meta(session, m))
            before = path.stat().st_size if path.is_file() else 0
            atomic_save(tensors, path, meta)
        self._wrote("manifests", path, before)
        return path

    @contextmanager
    def _manifest_lock(self):
        """An exclusive flock on the manifests' folder's `.lock` (every process on the folder
        with this identity), held while a manifest is compared and replaced."""
        self.manifest_dir.mkdir(parents=True, exist_ok=True)   # a folder removed meanwhile
        fd = os.open(self.manifest_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)                     # releases the lock

    # -- reading --------------------------------------------------------------------------------
    def _load(self, path: Path, kind: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
        """(metadata, tensors) of a file of `kind` that fits this reader; RefusedFile else."""
        if not path.is_file():
            raise RefusedFile("missing", f"{path.name} is not on disk", path)
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
        except Exception as e:           # truncated, not safetensors: refused, with the reason
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
        sums = self.check_meta(meta, kind, _layout(tensors), path)
        if any(sums[k] != checksum(t) for k, t in tensors.items()):
            raise RefusedFile("checksum", f"{path.name}: a tensor does not match its checksum",
                              path)
        return meta, tensors

    def check_meta(self, meta: dict[str, str], kind: str, layout: dict[str, list],
                   path: Path) -> dict[str, str]:
        """The checks of a file's metadata `meta` (its own checksum, format, kind, this reader's
        identity) and of its tensors' `layout` ({name: [torch dtype str, shape]}, as the file
        holds them) against the metadata's; returns the tensors' checksums by name (xxh3-64
        hex), which the caller compares with the data. Raises RefusedFile ('checksum',
        'format', an identity field's name, 'unreadable')."""
        if meta.get("meta_checksum") != _meta_checksum(meta):
            raise RefusedFile("checksum", f"{path.name}: its metadata fails its checksum", path)
        if meta.get("format") != FORMAT or meta.get("kind") != kind:
            raise RefusedFile("format", f"{meta.get('format')!r} {meta.get('kind')!r}, "
                                        f"expected {FORMAT!r} {kind!r}", path)
        for name, want in self.ident.as_meta().items():
            if meta.get(name) != want:
                raise RefusedFile(name, difference(name, meta.get(name), want), path)
        try:
            sums, want = json.loads(meta["checksums"]), json.loads(meta["layout"])
        except (KeyError, ValueError) as e:
            raise RefusedFile("unreadable", f"metadata: {type(e).__name__}: {e}", path) from e
        if want != layout or not isinstance(sums, dict) or set(sums) != set(layout):
            raise RefusedFile("checksum", f"{path.name}: a tensor does not match its checksum",
                              path)
        return sums

    def _used(self, path: Path) -> None:
        try:
            upkeep.renew(path)
        except OSError:                  # a read-only folder: the TTL counts from the write
            pass

    def read_page(self, key: bytes, ids) -> torch.Tensor:
        """kv [num_attention, 2, G, Hkv, D] of page `key` on the CPU, when its file holds the
        content of `ids` (its time renewed: used). Raises RefusedFile (reason 'missing' when
        there is no file, 'key' or 'ids' when it holds another content)."""
        path = self.page_path(key)
        meta, t = self._load(path, "page")
        if meta.get("key") != key.hex():
            raise RefusedFile("key", "the file holds another page", path)
        if t["ids"].tolist() != list(ids):
            raise RefusedFile("ids", "the page's ids differ", path)
        self._used(path)
        return t["kv"]

    def read_entry(self, key: bytes) -> tuple[int, GdnState, str]:
        """(line, states per GDN layer (conv, recurrent) on the CPU, kind) of entry `key` (its
        time renewed). Raises RefusedFile as read_page."""
        path = self.entry_path(key)
        try:
            meta, t = self._load(path, "gdn")
            if meta.get("key") != key.hex():
                raise RefusedFile("key", "the file holds another entry", path)
            n = len(t) // 2
            states = [(t[f"layers.{j}.conv"], t[f"layers.{j}.recurrent"]) for j in range(n)]
            line = int(meta["line"])
        except RefusedFile:
            self._note("gdn", key, there=False)
            raise
        except (KeyError, ValueError) as e:
            self._note("gdn", key, there=False)
            raise RefusedFile("unreadable", f"{type(e).__name__}: {e}", path) from e
        self._used(path)
        return line, states, meta.get("entry_kind", "checkpoint")

    def read_manifest(self, session: str) -> Manifest:
        """The session's manifest. Raises RefusedFile ('missing' without one, 'session' when
        the file names another session, 'manifest' when it does not hold together)."""
        path = self.manifest_path(session)
        found, m = self.read_manifest_file(path)
        if found != session:
            raise RefusedFile("session", "the manifest holds another session", path)
        return m

    def read_manifest_file(self, path: Path) -> tuple[str, Manifest]:
        """(session, manifest) of the manifest at `path`, whose name must be its session's.
        Raises RefusedFile as read_manifest."""
        meta, t = self._load(path, "manifest")
        session, m = from_meta(meta, t["ids"].tolist(), self.ident.grid, path)
        if path != self.manifest_path(session):
            raise RefusedFile("session", "the manifest's name is not its session's", path)
        return session, m

    def manifests(self) -> list[Path]:
        """This identity's manifest files, oldest first."""
        return [p for p, _ in upkeep.files(self.manifest_dir)]

    # -- upkeep ---------------------------------------------------------------------------------
    def count_refusal(self, reason: str) -> None:
        """Count one refused file under `reason` in `refusals` (since start: the one count of
        files refused, set aside or left in place and listed)."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def set_aside(self, path: Path | None, reason: str, counted: bool = False) -> None:
        """Move a refused file to D/refused/ (named with its folder, the reason, the time and
        this process) and count it under the reason in `refusals` (not when `counted`: its
        refusal was counted when it was listed); nothing for a file already gone (deleted or
        set aside by another reader)."""
        if path is None or not path.is_file():
            return
        aside = self.root / "refused"
        aside.mkdir(exist_ok=True)
        try:
            path.replace(aside / f"{path.parent.name}.{path.stem}.{reason}.{time.time_ns()}."
                                 f"{os.getpid()}{path.suffix}")
        except FileNotFoundError:
            return
        if path.parent in (self.root / "gdn", self.root / "pages"):
            self._note(path.parent.name, bytes.fromhex(path.stem), there=False)
        kind = {self.root / "pages": "pages", self.root / "gdn": "gdn_entries",
                self.manifest_dir: "manifests"}.get(path.parent)
        if kind and self._counts:            # its bytes stay counted: refused/ is the folder's
            self._counts[kind] -= 1
        if not counted:
            self.count_refusal(reason)

    def sweep(self, ttl_s: float, cap_bytes: int | None, keep: set[Path] = frozenset(),
              grace_s: float = 0.0) -> list[Path]:
        """upkeep.sweep over the folder (files younger than `grace_s` seconds kept); the index
        and counts listed again. Returns the deleted paths."""
        gone = upkeep.sweep(self.root, ttl_s, cap_bytes, set(keep), grace_s)
        self._relist(force=True)
        return gone


def writer_token() -> str:
    """A token naming this process and one store or reader in it: host, process id and 8 random
    hex digits (Manifest.writer; a router's name for the server, SessionTable.writer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def _keys(listed: list[tuple[Path, os.stat_result]]) -> set[bytes]:
    """The keys of listed page or entry files (their names' hex stems; others skipped)."""
    out = set()
    for path, _ in listed:
        try:
            out.add(bytes.fromhex(path.stem))
        except ValueError:                   # not one of ours: never looked up
            pass
    return out


def _layout(tensors: dict[str, torch.Tensor]) -> dict[str, list]:
    return {k: [str(v.dtype), list(v.shape)] for k, v in sorted(tensors.items())}


def _meta_checksum(meta: dict[str, str]) -> str:
    """xxh3-64 of the metadata but its own checksum, as canonical JSON."""
    rest = {k: v for k, v in meta.items() if k != "meta_checksum"}
    return xxhash.xxh3_64(json.dumps(rest, sort_keys=True).encode()).hexdigest()
