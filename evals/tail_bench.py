"""A question at a session's end with its tail kept, against the forwards it took before tails
(shadow_plugin.reader.tails), side by side in one process on the same adapter:

- `one forward` (the path before tails): ids[line:at] and the question in one forward from
  the grid line (Adapter.fork_logits at the line), as forks ran it until 2026-12-05;
- `tail, then the question` (no tail kept: a question that comes before the idle window made
  its tail): Adapter.read_rows of ids[line:cut], then fork_logits of ids[cut:at] and the
  question from cut;
- `kept tail` (the idle window made it): fork_logits from cut only;
- `ask kept` / `ask none`: Reader.ask's own ms (wall, the host's work included) with the tail
  kept and with max_tails=0 (both as fork.tail_cut cuts: a tail under a quarter of a grid goes
  with the question, so both are one forward there).

Each arm's forwards run over the same session state (a reader that read ids[:line]), timed
with CUDA events on CUDA (perf_counter on the CPU), warmed up first, the arms taken in turns;
figures are medians over `repeats`. The question is the router's (ROUTER), `tail` ids past the
grid line (330: the seed's measurement). The three forward arms cut at the multiple of 64 at or
below the end whatever the tail; fork.tail_cut's quarter-grid rule applies to the ask arms
only (a tail under fork.min_tail: `forwarded_kept` equals `forwarded_none` and `tail_hits` is 0).
Each context must be a multiple of the grid and each tail 64 to grid - 1 ids (refused
otherwise, naming the flag).

Each (context, tail) prints a line to stderr; the last line printed (stdout) is one JSON
object: `model`, `grid`, `dtype`, `attention`, `gpu` (the card; on the CPU the machine's
type), `torch`, `commit`, `date`, and per run (`runs`) `context`, `tail`, `question_ids`,
`forwarded_kept` / `forwarded_none` (num_forwarded_tokens of one more Reader.ask after the
timed rounds, tail kept / max_tails=0), `ms` (`one_forward`, `tail_then_question`,
`kept_tail`, `ask_kept`, `ask_none`), `kept_over_one_forward` (kept_tail / one_forward),
`answers_equal` (that last ask's probs, kept or not, bit for bit), `kept_equals_unkept_forward`
(the kept and the unkept tail's logits, bit for bit) and `tail_hits` (the kept reader's).
On the CPU torch takes every core unless --threads says otherwise: where other work shares
the machine pass --threads 1 (on 2 cores beside a test run, `ask_none` at 1024+200 took
1,027 ms with torch's 2 threads, 53 ms with 1).

    python -m evals.tail_bench [--model random:qwen3.5-0.8b] [--device cuda] [--grid 512]
        [--contexts 32768,100352] [--tails 64,330,506] [--repeats 7] [--attention fa4]
        [--threads N]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys

import torch

from adapters import ROW_ALIGN
from block_store.session import fork_pages
from evals.batch_bench import session_ids
from evals.bench import device_timer
from evals.run_info import git_commit
from shadow_plugin.chat.questions import letter_ids, question_ids
from shadow_plugin.chat.router import ROUTER
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader


def arms(reader: Reader, q_ids: list[int], letters: list[int]) -> dict:
    """The three forward arms over session "s" (C at its grid line): callables that run them,
    each from the same state, writing only scratch pages of their own."""
    st = reader._get("s")
    adapter, store, g = reader.adapter, reader.store, reader.config.grid
    at = len(st.ids)
    line, cut = at // g * g, at // ROW_ALIGN * ROW_ALIGN
    assert st.committed == line and cut > line
    kv, pages = fork_pages(store, st, at + 2 * g)   # scratch pages: the caller's to give back
    tail_gdn = adapter.read_rows(st.ids[line:cut], line, kv, st.gdn)

    def one():
        return adapter.fork_logits(st.ids[line:] + q_ids, line, kv, st.gdn, letters)

    def both():
        gdn = adapter.read_rows(st.ids[line:cut], line, kv, st.gdn)
        return adapter.fork_logits(st.ids[cut:] + q_ids, cut, kv, gdn, letters)

    def kept():
        return adapter.fork_logits(st.ids[cut:] + q_ids, cut, kv, tail_gdn, letters)

    return {"one_forward": one, "tail_then_question": both, "kept_tail": kept}, pages


def measure(model, context: int, tail: int, args) -> dict:
    grid = args.grid
    ids = session_ids(context + tail, context + tail)
    reader = Reader(model, grid=grid, attention=args.attention)
    none = Reader(model, grid=grid, attention=args.attention, max_tails=0)
    for r in (reader, none):
        r.feed("s", ids, "prompt")
        r.read("s")
    tok = load_tokenizer()                          # as Reader.ask renders the question
    q_ids = question_ids(tok, ROUTER.question, list(ROUTER.choices), ids[-1])
    letters = letter_ids(tok, len(ROUTER.choices))
    run, pages = arms(reader, q_ids, letters)
    timer = device_timer(model.device)
    times: dict[str, list[float]] = {k: [] for k in [*run, "ask_kept", "ask_none"]}
    try:
        with torch.no_grad():
            for fn in run.values():                       # warm-up: each shape's first run
                fn()
            reader.ask("s", ROUTER.question, list(ROUTER.choices))     # the tail kept here
            none.ask("s", ROUTER.question, list(ROUTER.choices))
            same = torch.equal(run["tail_then_question"](), run["kept_tail"]())
            for _ in range(args.repeats):
                for name, fn in run.items():
                    times[name].append(timer(fn)[1])
                times["ask_kept"].append(reader.ask("s", ROUTER.question,
                                                    list(ROUTER.choices)).ms)
                times["ask_none"].append(none.ask("s", ROUTER.question,
                                                  list(ROUTER.choices)).ms)
    finally:
        reader.store.release_pages(pages)
    a = reader.ask("s", ROUTER.question, list(ROUTER.choices))
    b = none.ask("s", ROUTER.question, list(ROUTER.choices))
    med = {k: round(statistics.median(v), 3) for k, v in times.items()}
    out = {"context": context, "tail": tail, "question_ids": len(q_ids),
           "forwarded_kept": a.num_forwarded_tokens, "forwarded_none": b.num_forwarded_tokens,
           "ms": med, "kept_over_one_forward": round(med["kept_tail"] / med["one_forward"], 3),
           "answers_equal": a.probs == b.probs, "kept_equals_unkept_forward": same,
           "tail_hits": reader.tails.num_hits}
    print(f"tails {context}+{tail}: {out}", file=sys.stderr, flush=True)
    return out


def _ints(parser, text: str, flag: str) -> list[int]:
    """Comma-separated positive integers, or the parser's error naming the flag."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        parser.error(f"{flag} takes comma-separated integers, got {text!r}")
    if not out or min(out) <= 0:
        parser.error(f"{flag} takes positive integers, got {text!r}")
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].rstrip(":") + ".")
    p.add_argument("--model", default="random:qwen3.5-0.8b",
                   help="a Qwen3.5 model directory or random:NAME (default random:qwen3.5-0.8b)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda (default: cuda when available)")
    p.add_argument("--grid", type=int, default=512, help="the chunk length G (default 512)")
    p.add_argument("--contexts", default="32768,100352",
                   help="ids below the grid line, comma-separated multiples of the grid")
    p.add_argument("--tails", default="64,330,506",
                   help="ids past the grid line, comma-separated, each 64 or more")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds, medians (default 7)")
    p.add_argument("--attention", default=None, help="the CUDA runners' attention: fa4 or table")
    p.add_argument("--threads", type=int, default=None,
                   help="torch's CPU threads (default: torch's; 1 on a shared CPU)")
    args = p.parse_args(argv)
    contexts, tails = _ints(p, args.contexts, "--contexts"), _ints(p, args.tails, "--tails")
    if any(c % args.grid for c in contexts):
        p.error(f"--contexts must be multiples of the grid ({args.grid}): {args.contexts}")
    if any(not ROW_ALIGN <= t < args.grid for t in tails):
        p.error(f"--tails must be {ROW_ALIGN} to {args.grid - 1} ids: {args.tails}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from adapters import load_model
    model = load_model(args.model, device=args.device)
    res = {"bench": "tail_bench", "model": args.model, "grid": args.grid,
           "dtype": str(model.dtype).removeprefix("torch."), "attention": args.attention,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else platform.machine(),
           "torch": torch.__version__, "commit": git_commit(),
           "date": datetime.date.today().isoformat(), "runs": []}
    for context in contexts:
        for tail in tails:
            res["runs"].append(measure(model, context, tail, args))
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
