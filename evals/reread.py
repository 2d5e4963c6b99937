"""Issue 16's re-read targets over recorded sessions, measured as the product is used (issue
33): each session replayed alone through a fresh reader under the default resident cap, the
router question asked after every turn as `shadow-reader replay` asks it (`--no-questions`:
reads only, issue 16's first measurement), every rewrite recorded with the ids it sent back to
be read again below the furthest C (evals.replay.replay_turn's records), and checked against
its bound (evals.replay.bound_summary): the ids from its first difference to the furthest C,
plus one page (so a BPE-boundary rewrite without questions: one page).

    python -m evals.reread ../shared/data/sessions/*.json [--model random:qwen3.5-0.8b]
        [--device cuda] [--check-exact] [--no-questions]

Prints a line a session and, last, one JSON object (per session: the replay totals with
max_reread_bpe/template and num_over_bound_bpe/template, ids read per id held, GDN entries and
bytes held at the end, and the records past their bound).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from adapters.model import load_model
from evals.replay import load_session, replay_turns
from shadow_plugin.chat.host_view import host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.router import ROUTER
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader


def replay_alone(model, path: Path, renderer, tokenizer, grid: int, check_exact: bool,
                 questions: bool = True) -> dict:
    """One session through a fresh reader (the default cap), the router question after every
    turn unless not `questions`: its totals, ids read per id held, the GDN entries and bytes
    held at the end, and the rewrites past their bound."""
    messages, tools = load_session(path)
    turns = host_turns(messages, tools or None, renderer, tokenizer, None)
    reader = Reader(model, grid=grid, tokenizer=tokenizer)
    totals = replay_turns(reader, path.stem, turns, ROUTER if questions else None,
                          check_exact=check_exact, out=None)
    s = reader.stats()
    return {**totals.as_dict(), "committed": reader.committed(path.stem),
            "read_per_held": round(totals.num_read / max(1, totals.num_ids), 3),
            "gdn_entries_held": s["gdn_entries"]["resident"],
            "gdn_entry_bytes": s["gdn_entry_bytes"],
            "gdn_entry_evictions": s["gdn_entry_evictions"],
            "over_bound": [r for r in totals.rewrites if not r["within"]],
            "rewrites": totals.rewrites}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sessions", nargs="+", type=Path)
    ap.add_argument("--model", default=None, help="default random:qwen3.5-0.8b on CUDA, "
                                                  "random:tiny on the CPU")
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--check-exact", action="store_true")
    ap.add_argument("--no-questions", action="store_true",
                    help="reads only, no question after a turn (issue 16's measurement)")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = args.model or ("random:qwen3.5-0.8b" if device == "cuda" else "random:tiny")
    model = load_model(spec, device=device)
    tokenizer = load_tokenizer(None if spec.startswith("random:") else spec)
    renderer = Renderer.from_model_dir(None, template="qwen3.5-27b")
    out = {"probe": "reread", "model": spec, "device": device, "grid": args.grid,
           "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "torch": torch.__version__, "date": datetime.date.today().isoformat(),
           "questions": not args.no_questions, "sessions": {}}
    for path in args.sessions:
        res = replay_alone(model, path, renderer, tokenizer, args.grid, args.check_exact,
                           not args.no_questions)
        out["sessions"][path.stem] = {k: v for k, v in res.items() if k != "rewrites"}
        print(f"{path.stem}: {res['num_ids']} ids, read {res['num_read']} "
              f"({res['read_per_held']} per id held), rewrites "
              f"bpe {res['rewrites_bpe']} (max re-read {res['max_reread_bpe']}) template "
              f"{res['rewrites_template']} (max re-read {res['max_reread_template']}), past "
              f"the bound {len(res['over_bound'])}, GDN entries held "
              f"{res['gdn_entries_held']} ({res['gdn_entry_bytes']} bytes), exact "
              f"{res['exact']}", flush=True)
    out["num_over_bound"] = sum(len(s["over_bound"]) for s in out["sessions"].values())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
