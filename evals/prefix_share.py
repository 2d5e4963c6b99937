"""Sharing an agent's prefix (issue 16's sharing target): the shared sessions replayed as one
agent's workload with its prefix (`--prefix`, a file of ../shared/data/prefixes), each alone
through a fresh reader and then all together through one reader, interleaved turn by turn.
Checks, per session after the first: ids read together <= ids read alone - the whole pages it
shares with an earlier session's first prompt + one page (measured from the rendered prompts,
not assumed: where a session's own system text lands depends on the chat template; with
Qwen3.5's and opencode's prefix all six shared sessions share 21 pages); reports the hit rate,
resident bytes, pages held, GDN entry bytes, and whether the prefix's pages are held once
(resident bytes <= the sessions' own pages + one copy of the prefix + the GDN table's entries +
the sessions' GDN states). The JSON line comes before the plot is written.

    python -m evals.prefix_share --prefix ../shared/data/prefixes/opencode_qwen.json \\
        --model random:tiny --device cpu [SESSION.json ...] [--plot hits.png]
    shadow-reader prefix-hits ...                    (the same, from the command line)

(default: every shared session). No questions are asked (reads only). `--plot`: a PNG of the
ids each session read alone and together, with its bound, and the hit rate (matplotlib, the
`plot` extra). Prints a line per session and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from adapters.model import load_model
from evals.data import data_dir
from evals.replay import load_prefix, load_session, replay_many, with_prefix
from shadow_plugin.chat.host_view import host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader


def _turns(paths, prefix, renderer, tokenizer):
    out = []
    for p in paths:
        messages, _ = load_session(p)
        messages, tools = with_prefix(messages, prefix)
        out.append((Path(p).stem, host_turns(messages, tools, renderer, tokenizer)))
    return out


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def main(argv=None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description="One agent's sessions with its prefix, "
                                 "each alone and then all together through one reader: ids "
                                 "read per session against the bound, the prefix cache's hit "
                                 "rate, bytes held (a plot with --plot).")
    ap.add_argument("sessions", nargs="*", help="session files (default: the shared set)")
    ap.add_argument("--prefix", required=True, help="a prefix file (../shared/data/prefixes)")
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--plot", help="write a PNG of ids read alone and together here")
    args = ap.parse_args(argv)
    if args.plot and not Path(args.plot).expanduser().resolve().parent.is_dir():
        raise ValueError(f"--plot {args.plot}: its folder does not exist")
    paths = args.sessions or sorted(str(p) for p in (data_dir() / "sessions").glob("*.json"))
    prefix = load_prefix(args.prefix)
    tokenizer, renderer = load_tokenizer(), Renderer.from_model_dir(None)
    sessions = _turns(paths, prefix, renderer, tokenizer)
    model = load_model(args.model, device=args.device)
    alone = {}
    for sid, turns in sessions:
        r = Reader(model, grid=args.grid, tokenizer=tokenizer)
        alone[sid] = replay_many(r, [(sid, turns)], None, out=None)["sessions"][sid]
        print(f"{sid}: alone read {alone[sid]['num_read']}", file=sys.stderr, flush=True)
    reader = Reader(model, grid=args.grid, tokenizer=tokenizer)
    together = replay_many(reader, sessions, None, check_exact=True, out=sys.stdout)
    prefix_ids = len(tokenizer.encode(prefix[0]))
    firsts = [turns[0].prompt_ids if turns else [] for _, turns in sessions]
    per, met, shared_pages = {}, True, 0
    for i, (sid, _) in enumerate(sessions):
        got, solo = together["sessions"][sid]["num_read"], alone[sid]["num_read"]
        pages = max([_common(firsts[i], f) // args.grid for f in firsts[:i]], default=0)
        shared_pages += pages
        bound = solo - pages * args.grid + (args.grid if i else 0)
        per[sid] = {"read_alone": solo, "read_together": got, "shared_whole_pages": pages,
                    "bound": bound, "met": got <= bound,
                    "exact": together["sessions"][sid]["exact"]}
        met = met and got <= bound
    s = reader.stats()
    own = sum(len(st.pages) for st in reader.resident_states())
    live = sum(c.nbytes + r.nbytes for st in reader.resident_states() for c, r in st.gdn)
    held_once = s["resident_bytes"] <= (own - shared_pages) * s["page_bytes"] + \
        s["gdn_entry_bytes"] + live
    print(json.dumps({
        "model": args.model, "device": args.device, "grid": args.grid,
        "dtype": str(model.dtype).removeprefix("torch."),
        "torch": torch.__version__, "date": str(datetime.date.today()),
        "prefix": Path(args.prefix).name, "prefix_system_ids": prefix_ids,
        "sessions": per, "target_met": met,
        "prefix_held_once": held_once,
        **{k: together[k] for k in ("prefix_cache_hit_rate", "prefix_cache_queried_tokens",
                                    "prefix_cache_hit_tokens", "read_tokens", "reread_tokens",
                                    "resident_bytes", "pages", "page_bytes", "gdn_entry_bytes",
                                    "gdn_entries_by_kind", "gdn_entry_hits")}}), flush=True)
    if args.plot:                        # after the result: a failing write must not lose it
        plot(per, together["prefix_cache_hit_rate"], Path(args.prefix).name, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def plot(per: dict, hit_rate: float, prefix: str, path) -> None:
    """Bars of the ids each session read alone and together, its bound as a tick."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(per)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4))
    ax.bar([i - 0.2 for i in x], [per[n]["read_alone"] for n in names], 0.4, label="alone")
    ax.bar([i + 0.2 for i in x], [per[n]["read_together"] for n in names], 0.4,
           label="together")
    ax.scatter([i + 0.2 for i in x], [per[n]["bound"] for n in names], marker="_", s=400,
               color="black", label="bound", zorder=3)
    ax.set_xticks(list(x), names, rotation=20, ha="right", fontsize=8)
    ax.set(ylabel="ids read", title=f"prefix {prefix}: hit rate {hit_rate:.3f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
