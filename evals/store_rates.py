"""What a store shared past one host would hold and take (issue 37, docs/scale.md): the bytes of
a KV page, a GDN entry and a manifest for the Qwen3.5 models, and the write rates the recorded
request timelines imply when each agent's session is followed by a shadow that writes its
pages and states as it goes (SHADOW_DISK_SHARED=1).

The model of a session's writes, per host request of a timeline (prompt P ids, output O ids):
the shadow reads up to the turn's end, so every page completed below P + O since the last
turn is written once (a prompt shorter than the last turn's end, as after a compaction,
starts a new chain: all its pages are new); the tip ring's entries at up to 4 of those lines
(checkpoints.TIP_LINES; the prompt's checkpoint is one of them or one more); and the manifest,
ids included, 4 times (the turn's start, its outputs' stale mark, its end, and its read-up).
Sessions are taken as they are logged: GLM and Anthropic token counts stand in for Qwen ids.

    python -m evals.store_rates [--timelines DIR] [--grid 512]

Prints a table and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from adapters.model.config import PRESETS, spec_for
from block_store.memory.layout import zero_gdn
from evals.data import data_dir

MODELS = ("qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b")
TIP_LINES = 4                 # checkpoints.TIP_LINES: the ring's entries written at a read-up
MANIFEST_WRITES = 4           # a turn's start, the outputs' stale mark, its end, its read-up
ID_BYTES = 8                  # a manifest holds its ids as int64
# timeline files whose requests carry the provider's prompt and output counts and end times
TIMELINES = {"gjc_01_youtube_transcripts.json": ("request_start", "request_end",
                                                 "output_tokens"),
             "gjc_03_raddit_dashboard_pr.json": ("request_start", "request_end",
                                                 "output_tokens"),
             "claudecode_vsla.json": ("request_start_approx", "request_end_approx",
                                      "output_tokens_logged")}


def sizes(name: str, grid: int) -> dict[str, int]:
    """Bytes of one KV page (every attention layer's K and V, bf16, `grid` rows) and one GDN
    entry (every GDN layer's conv state in bf16 and recurrent state in fp32) of a model."""
    cfg = PRESETS[name]
    spec = spec_for(cfg, "meta", torch.bfloat16)
    entry = sum(c.nbytes + r.nbytes for c, r in zero_gdn(spec))
    return {"page_bytes": cfg.kv_bytes_per_row(2) * grid, "gdn_entry_bytes": entry,
            "kv_bytes_per_id": cfg.kv_bytes_per_row(2)}


def _t(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def writes(requests: list[dict], keys: tuple[str, str, str], grid: int) -> list[dict]:
    """Per request (main chain only), when its turn ended and what it wrote: pages, entries,
    manifest ids (module doc)."""
    start, end, out_key = keys
    rows, last_end = [], 0
    for r in sorted((r for r in requests if not r.get("sidechain")), key=lambda r: r[start]):
        p, o = int(r["prompt_tokens"]), int(r.get(out_key) or 0)
        base = last_end if p >= last_end else 0         # shorter: a new chain
        pages = (p + o) // grid - base // grid
        rows.append({"t": _t(r[end] or r[start]), "ids": p + o - base, "pages": pages,
                     "entries": min(pages, TIP_LINES), "manifest_ids": MANIFEST_WRITES * (p + o),
                     "prompt": p})
        last_end = p + o
    return rows


def rates(rows: list[dict], size: dict[str, int]) -> dict:
    """A session's write rates: mean over its span and its busiest minute, in ids, pages,
    objects (files or PUTs) and MB/s."""
    span_min = max((rows[-1]["t"] - rows[0]["t"]) / 60, 1.0)

    def nbytes(r: dict) -> int:
        return r["pages"] * size["page_bytes"] + r["entries"] * size["gdn_entry_bytes"] + \
            r["manifest_ids"] * ID_BYTES

    minutes = Counter()
    for r in rows:
        minutes[int(r["t"] // 60)] += nbytes(r)
    total = sum(nbytes(r) for r in rows)
    objects = sum(r["pages"] + r["entries"] + MANIFEST_WRITES for r in rows)
    return {"num_requests": len(rows), "span_min": round(span_min, 1),
            "ids_per_min": round(sum(r["ids"] for r in rows) / span_min),
            "pages_per_min": round(sum(r["pages"] for r in rows) / span_min, 2),
            "objects_per_min": round(objects / span_min, 1),
            "mb_per_s": round(total / 2**20 / span_min / 60, 3),
            "peak_minute_mb_per_s": round(max(minutes.values()) / 2**20 / 60, 3),
            "entry_share": round(sum(r["entries"] for r in rows) * size["gdn_entry_bytes"] /
                                 total, 3),
            "manifest_share": round(sum(r["manifest_ids"] * ID_BYTES for r in rows) / total, 3),
            "max_prompt": max(r["prompt"] for r in rows)}


def restore_bytes(num_ids: int, size: dict[str, int], grid: int) -> int:
    """What a restore of a session of num_ids ids reads: its whole pages, one GDN entry, its
    manifest."""
    return num_ids // grid * size["page_bytes"] + size["gdn_entry_bytes"] + num_ids * ID_BYTES


def run(args) -> dict:
    models = {m: sizes(m, args.grid) for m in MODELS}
    size = models["qwen3.5-0.8b"]                 # 0.8B and 2B hold the same state
    sessions = {}
    for name, keys in TIMELINES.items():
        path = Path(args.timelines) / name
        for s in json.loads(path.read_text())["sessions"]:
            rows = writes(s["requests"], keys, args.grid)
            if len(rows) >= 2:
                sessions[f"{path.stem}/{s['session_id'][:8]}"] = rates(rows, size)
    restores = {n: restore_bytes(n, size, args.grid) for n in (8192, 32768, 65536, 131072)}
    return {"grid": args.grid, "models": models, "sessions": sessions,
            "restore_bytes_0.8b": restores, "timelines": str(args.timelines),
            "date": str(datetime.date.today())}


def table(res: dict) -> str:
    rows = ["| timeline/session | requests | span min | ids/min | pages/min | objects/min | "
            "MB/s mean | MB/s busiest minute | GDN entries' share | manifests' share | "
            "largest prompt |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in res["sessions"].items():
        rows.append(f"| {name} | {r['num_requests']} | {r['span_min']} | {r['ids_per_min']:,} "
                    f"| {r['pages_per_min']} | {r['objects_per_min']} | {r['mb_per_s']} | "
                    f"{r['peak_minute_mb_per_s']} | {r['entry_share']} | {r['manifest_share']} | "
                    f"{r['max_prompt']:,} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timelines", default=str(data_dir() / "timelines"))
    ap.add_argument("--grid", type=int, default=512)
    args = ap.parse_args(argv)
    res = run(args)
    print(table(res), file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
