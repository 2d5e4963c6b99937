"""`shadow-reader replay`: the command around evals/replay.py (its flags are in evals/cli.py):
sessions loaded and checked before the model, one reader (with a disk tier and a resident cap
when asked), one file replayed alone or several interleaved, and one JSON line of totals with
what the store held, evicted and wrote (`store`).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

from evals.data import default_model


def _session_names(paths: list[str]) -> list[str]:
    """A session name a file: its stem, with -2, -3, ... after a stem seen before (two files
    of one name in different folders, or one file given twice)."""
    names: list[str] = []
    for p in paths:
        stem, n = Path(p).stem, 1
        while (f"{stem}-{n}" if n > 1 else stem) in names:
            n += 1
        names.append(f"{stem}-{n}" if n > 1 else stem)
    return names


def replay_command(args) -> int:
    """`shadow-reader replay` (flags: evals.cli.build_parser): 0, or 1 when not exact."""
    from adapters.model import load_model
    from evals.replay import load_prefix, load_session, replay_file, replay_many, with_prefix
    from shadow_plugin.chat.host_view import host_turns
    from shadow_plugin.chat.renderer import Renderer
    from shadow_plugin.chat.router import load_question
    from shadow_plugin.chat.tokenizer import load_tokenizer
    from shadow_plugin.reader.exact import ExactnessError
    from shadow_plugin.reader.reader import Reader
    from shadow_plugin.reader.step import ReaderConfig

    ReaderConfig(args.grid)                          # bad flags and files fail before the model
    _check_store_flags(args)
    loaded = [load_session(path) for path in args.session]
    prefix = load_prefix(args.prefix) if args.prefix else None
    if prefix:
        loaded = [with_prefix(messages, prefix) for messages, _ in loaded]
    stems = _session_names(args.session)
    question = load_question(args.question)
    renderer = Renderer.from_model_dir(args.template_dir, template=args.template)
    if args.template_dir and not renderer.uses_model_template:
        print(f"note: {args.template_dir} has no chat template; using {args.template}",
              file=sys.stderr)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = args.model or default_model(device)
    model = load_model(spec, device=device)
    tokenizer = load_tokenizer(None if spec.startswith("random:") else spec)
    store = {} if args.resident_mb is None else {"resident_bytes": int(args.resident_mb * 2**20)}
    reader = Reader(model, grid=args.grid, tokenizer=tokenizer, disk_dir=args.disk, **store)
    print(f"model {model.info.name} ({'random' if model.info.is_random else 'real'} weights, "
          f"fingerprint {model.info.fingerprint[:12]}), device {device}, grid {args.grid}, "
          f"kernels {model.kernels.name}", file=sys.stderr)
    thinking = False if args.no_thinking else None
    for stem in stems:          # a session of an earlier run on the same --disk: start afresh
        if reader.knows(stem):
            reader.drop(stem)
            print(f"note: session {stem} of an earlier run on {args.disk} dropped: replayed "
                  f"afresh (the pages and entries on disk stay findable by key)", file=sys.stderr)
    try:
        if len(args.session) == 1:
            (messages, tools), = loaded
            result = replay_file(reader, args.session[0], renderer, tokenizer, question,
                                 args.check_exact, thinking, out=sys.stdout,
                                 messages=messages, tools=tools).as_dict()
        else:
            sessions = [(stem, host_turns(m, t or None, renderer, tokenizer, thinking))
                        for stem, (m, t) in zip(stems, loaded)]
            result = replay_many(reader, sessions, question, args.check_exact, out=sys.stdout)
    except ExactnessError as e:
        print(f"shadow-reader: NOT EXACT: {e}", file=sys.stderr)
        return 1
    held = _held(reader)
    if args.disk is not None:
        reader.close()                  # a planned stop: every session written, writes done
    print(json.dumps({**result, "store": {**held, **_store_counts(reader, args.disk)}}))
    return 0


def _check_store_flags(args) -> None:
    """--resident-mb finite and >= 0; --disk a folder this process can create and write in.
    ValueError naming the flag (before the model loads)."""
    if args.resident_mb is not None and not 0 <= args.resident_mb < float("inf"):
        raise ValueError(f"--resident-mb must be a finite number >= 0, got {args.resident_mb}")
    if args.disk is None:
        return
    if args.disk.exists() and not args.disk.is_dir():
        raise ValueError(f"--disk {args.disk}: not a folder")
    try:
        args.disk.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=args.disk):
            pass
    except OSError as e:
        raise ValueError(f"--disk {args.disk}: cannot write there ({e.strerror or e})") from None


def _held(reader) -> dict:
    """Resident bytes (and the cap) and the GDN entries held, from reader.stats()."""
    s = reader.stats()
    return {k: s[k] for k in ("resident_bytes", "resident_cap_bytes", "gdn_entries",
                              "gdn_entry_bytes")}


def _store_counts(reader, disk: Path | None) -> dict:
    """What memory forgot and where it went (reader.stats()): evictions, what of them was
    written, restores, the ids resumed by tier, and the disk folder's bytes (`disk_bytes`, its
    files summed now: the reader's own count lists the folder at most every 10 s; 0 without
    a disk)."""
    s = reader.stats()
    keys = ("gdn_entries_evicted", "pages_reused", "evicted_written", "gdn_entries_not_written",
            "evicted_already_on_disk", "spills", "restores", "prefix_cache_hit_tokens")
    on_disk = sum(f.stat().st_size for f in disk.rglob("*") if f.is_file()) if disk else 0
    return {**{k: s[k] for k in keys}, "disk_bytes": on_disk}
