"""Upkeep of the disk tier's folder (disk.DiskStore): what a listing costs, the TTL and byte
cap, temporary files of writers that died, and counts that do not list the folder on every
call.

The folder D holds pages/, gdn/, sessions/<identity>/ (manifests, one subfolder a reader
identity) and refused/. `sweep` deletes files past the TTL (every kind, every identity's),
then, past the byte cap, refused files and then the oldest pages and GDN entries; a manifest
goes only with the TTL (it holds a session's ids, which nothing else keeps).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

SUFFIX = ".safetensors"
STRAY_TMP_S = 3600      # a library's own temporary file this old belongs to no live writer


def files(folder: Path, recursive: bool = False) -> list[tuple[Path, os.stat_result]]:
    """(path, stat) of the finished files in `folder` (no temporaries), oldest first; none for
    a folder that is gone."""
    out: list[tuple[Path, os.stat_result]] = []
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False) and recursive:
                    out += files(Path(e.path))
                elif e.name.endswith(SUFFIX) and not e.name.startswith("."):
                    try:
                        out.append((Path(e.path), e.stat()))
                    except FileNotFoundError:    # deleted meanwhile by another reader
                        pass
    except FileNotFoundError:
        return []
    return sorted(out, key=lambda f: f[1].st_mtime)


def listing(root: Path) -> dict[str, list[tuple[Path, os.stat_result]]]:
    """files() of each of the folder's parts: pages, gdn, sessions (every identity's), refused."""
    return {"pages": files(root / "pages"), "gdn": files(root / "gdn"),
            "sessions": files(root / "sessions", recursive=True),
            "refused": files(root / "refused")}


def counts(listed: dict[str, list[tuple[Path, os.stat_result]]],
           manifest_dir: Path) -> dict[str, int]:
    """Files held in a `listing`: pages, GDN entries, this identity's manifests, and every
    file's bytes."""
    return {"pages": len(listed["pages"]), "gdn_entries": len(listed["gdn"]),
            "manifests": sum(p.parent == manifest_dir for p, _ in listed["sessions"]),
            "bytes": sum(st.st_size for fs in listed.values() for _, st in fs)}


def sweep(root: Path, ttl_s: float, cap_bytes: int | None, keep: set[Path],
          grace_s: float = 0.0) -> list[Path]:
    """Delete files older than `ttl_s` (every kind), then, past `cap_bytes`, the oldest
    refused files, then the oldest pages and GDN entries together; manifests only by age;
    never those in `keep`, nor a file written or used (its time renewed: renew) within the
    last `grace_s` seconds, which a process sharing the folder may be about to read (the
    folder may then stay above the cap until they age). Returns the deleted paths."""
    now, gone, listed = time.time(), [], listing(root)
    total = sum(st.st_size for fs in listed.values() for _, st in fs)

    def young(st: os.stat_result) -> bool:
        return grace_s > 0 and now - st.st_mtime <= grace_s

    for path, st in [f for fs in listed.values() for f in fs]:
        if now - st.st_mtime > ttl_s and not young(st) and path not in keep and \
                _unlink_unless_renewed(path, st, grace_s):
            total -= st.st_size
            gone.append(path)
    by_age = listed["refused"] + sorted(listed["pages"] + listed["gdn"],
                                        key=lambda f: f[1].st_mtime)
    for path, st in by_age:
        if cap_bytes is None or total <= cap_bytes:
            break
        if path not in keep and path not in gone and not young(st) and \
                _unlink_unless_renewed(path, st, grace_s):
            total -= st.st_size
            gone.append(path)
    return gone


def _unlink_unless_renewed(path: Path, listed: os.stat_result, grace_s: float) -> bool:
    """Delete `path` unless, with a grace period, another process renewed or rewrote it since
    the sweep listed it (its time is newer than the listing's: a lookup about to read it,
    renew); whether it was deleted. The window left between this stat and the unlink is a
    few microseconds; a file lost in it makes a restore resume lower, never inexact."""
    if grace_s > 0:
        try:
            if path.stat().st_mtime > listed.st_mtime:
                return False
        except FileNotFoundError:
            return False
    path.unlink(missing_ok=True)
    return True


def clear_temporaries(folder: Path) -> None:
    """Remove atomic writes' temporaries whose writer is gone (files.atomic_save:
    `.NAME.PID-THREAD.tmp`) and a library's own temporaries (`.tmp*`) older than an hour."""
    now = time.time()
    for tmp in folder.glob(".*"):
        try:
            if tmp.name.endswith(".tmp") and not alive(tmp):
                tmp.unlink(missing_ok=True)
            elif tmp.name.startswith(".tmp") and now - tmp.stat().st_mtime > STRAY_TMP_S:
                tmp.unlink(missing_ok=True)
        except (FileNotFoundError, IsADirectoryError):
            pass


def alive(tmp: Path) -> bool:
    """Whether the writer of a temporary file (`.NAME.PID-THREAD.tmp`) still runs on this
    machine (a process id reused since counts as running: the file then waits)."""
    try:
        os.kill(int(tmp.name.rsplit(".", 2)[-2].split("-")[0]), 0)
        return True
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:              # another user's process
        return True


def renew(path: Path) -> bool:
    """Whether `path` exists; its time is renewed when it does (the TTL and the cap count from
    the last use)."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
