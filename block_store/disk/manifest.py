"""A session's manifest: what a restart trusts (disk.DiskStore writes and reads it): its ids,
C, the keys of its pages [0, C), the key of its states at C, checkpoints, pending lines, the
shared line, whether it is stale (outputs the host sent after it was written were lost), and its
version: the writing process's token and a number one past the version it replaced (several
servers on one folder: DiskStore.write_manifest replaces only the version its writer last
saw). Kept in a safetensors file as `ids` int64 [N] and these fields as metadata (`to_meta`,
`from_meta`); keys as 32 hex digits.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from block_store.disk.files import RefusedFile


class Superseded(Exception):
    """A session's manifest on disk is a version this writer has not seen: another process on
    the folder wrote it since (several servers on one folder); `mark` is its (writer, seq)."""

    def __init__(self, session: str, mark: tuple[str, int]):
        super().__init__(f"session {session!r}: the folder holds a newer manifest, version "
                         f"{mark[1]} by {mark[0] or 'an earlier version'}")
        self.session, self.mark = session, mark


@dataclass
class Manifest:
    """What a restart trusts for one session: its ids, C, the keys of its pages [0, C) (hex),
    the key of the GDN entry holding its state at C (None at C = 0), its checkpoints
    [(line, entry key hex, episode_start, kept)], pending lines {line: episode_start}, the
    shared line, when it was written (s since the epoch), `stale`: written just before
    outputs were appended (Reader.mark_outputs), so a restart that finds it holds a prefix of
    what the host sent, not all of it; `writer` (the writing process's token,
    DiskStore.writer) and `seq` (the version: one past the one it replaced)."""

    ids: list[int]
    committed: int
    page_keys: list[str]
    state_key: str | None
    checkpoints: list[tuple[int, str, bool, bool]] = field(default_factory=list)
    pending_lines: dict[int, bool] = field(default_factory=dict)
    shared_line: int = 0
    written_at: float = 0.0
    stale: bool = False
    writer: str = ""
    seq: int = 0

    @property
    def mark(self) -> tuple[str, int]:
        """(writer, seq): which process wrote this version of the manifest and its number
        (each write is the one it replaced plus one); ("", 0) for a manifest from before."""
        return self.writer, self.seq


def to_meta(session: str, m: Manifest) -> dict[str, object]:
    """The metadata fields of `session`'s manifest (the session id as JSON: any str, lone
    surrogates included, survives)."""
    return {"session": json.dumps(session), "committed": m.committed,
            "page_keys": json.dumps(m.page_keys), "state_key": m.state_key or "",
            "checkpoints": json.dumps([list(c) for c in m.checkpoints]),
            "pending_lines": json.dumps(sorted([p, e] for p, e in m.pending_lines.items())),
            "shared_line": m.shared_line, "written_at": time.time(), "stale": int(m.stale),
            "writer": m.writer, "seq": m.seq}


def from_meta(meta: dict[str, str], ids: list[int], grid: int, path: Path
              ) -> tuple[str, Manifest]:
    """(session, Manifest) from a manifest file's metadata and ids. Raises RefusedFile
    ('manifest') for fields that do not parse or do not hold together (C off the grid or past
    the ids, page keys that do not cover C, a state key without C or C without one)."""
    try:
        session = json.loads(meta["session"])
        m = Manifest(
            ids=ids, committed=int(meta["committed"]),
            page_keys=[hex_key(k) for k in json.loads(meta["page_keys"])],
            state_key=hex_key(meta["state_key"]) if meta["state_key"] else None,
            checkpoints=[(int(p), hex_key(k), bool(e), bool(kp))
                         for p, k, e, kp in json.loads(meta["checkpoints"])],
            pending_lines={int(p): bool(e) for p, e in json.loads(meta["pending_lines"])},
            shared_line=int(meta["shared_line"]), written_at=float(meta["written_at"]),
            stale=bool(int(meta.get("stale", 0))), writer=meta.get("writer", ""),
            seq=int(meta.get("seq", 0)))
        if not isinstance(session, str):
            raise TypeError(f"session {session!r} is not a string")
    except (KeyError, ValueError, TypeError) as e:
        raise RefusedFile("manifest", f"{type(e).__name__}: {e}", path) from e
    if m.committed % grid or not 0 <= m.committed <= len(m.ids) or \
            len(m.page_keys) != m.committed // grid or (m.committed > 0) != bool(m.state_key):
        raise RefusedFile("manifest", f"C {m.committed} does not fit {len(m.ids)} ids, "
                                      f"{len(m.page_keys)} pages and the state key", path)
    return session, m


def hex_key(text: str) -> str:
    """A key as 32 hex digits; ValueError for anything else."""
    if not isinstance(text, str) or len(bytes.fromhex(text)) != 16:
        raise ValueError(f"not a page key: {text!r}")
    return text


def peek_meta(path: Path) -> dict[str, str] | None:
    """A safetensors file's metadata, read from its header without any check; None when the
    file is gone or its header does not read."""
    try:                                   # the header alone: a damaged body does not matter
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(min(size, 100 * 2**20)))["__metadata__"]
        return meta if isinstance(meta, dict) else None
    except Exception:                      # gone, or a damaged header
        return None


def peek_session(path: Path) -> str | None:
    """The session id a manifest file names in its header, read without any check (to name a
    session whose manifest was refused); None when even that does not read."""
    try:
        session = json.loads((peek_meta(path) or {})["session"])
        return session if isinstance(session, str) else None
    except Exception:                      # a damaged header: nothing to name
        return None


def peek_mark(path: Path) -> tuple[str, int] | None:
    """(writer, seq) of the manifest at `path` (Manifest.mark), read from its header without
    any check; None when there is no file (or its header does not read)."""
    meta = peek_meta(path)
    if meta is None:
        return None
    try:
        return str(meta.get("writer", "")), int(meta.get("seq", 0))
    except (TypeError, ValueError):
        return str(meta.get("writer", "")), -1
