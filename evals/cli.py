"""shadow-reader: an exact incremental Qwen3.5 reader that follows the sessions a big model serves.

Commands:
  replay   replay a recorded agent session turn by turn through the reader
  export-model  a preset's random weights as a Hugging Face directory
  bench    the read benchmark
  fresh    how fresh the shadow stays on recorded request timelines
  serve    the HTTP service for hosts in another process
  prefix-hits  one agent's sessions with its prefix, alone and together (evals/prefix_share.py)
  router-eval  the router question at labelled turns against the labels (evals/router_eval.py)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch
from jinja2 import TemplateError

from evals.data import data_dir
from evals.replay_cmd import replay_command

RUN_OF_RECORD = Path(__file__).with_name("read_costs_h200.json")   # fresh's default costs

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="shadow-reader", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rp = sub.add_parser(
        "replay", help="replay a recorded agent session turn by turn through the reader",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay a session as its host served it: per assistant message, feed the "
        "prompt (rendered with the host's chat template, tokenised whole) and the output, read "
        "all whole chunks, ask the question. One row a turn, then one JSON line of totals.",
        epilog="models: a Hugging Face Qwen3.5 directory, or random:tiny, random:qwen3.5-0.8b, "
        "random:qwen3.5-2b, random:qwen3.5-4b (seeded random weights)\n"
        "templates: qwen3.5-27b (default, thinking on), qwen3.5-0.8b, qwen3.6-27b, ...\n"
        "question file: {\"question\": str, \"choices\": [str, ...], \"labels\": [str, ...]}\n"
        "columns: turn, prompt ids, ids read (this turn, asks included), rollback (C from -> "
        "to), read ms, C (committed), tail (ids not yet read), checkpoints, answer, its "
        "probability, ask ms")
    rp.add_argument("session", nargs="+", help="a session JSON file ({'messages': [...], "
                    "'tools': [...]}); several: one agent's sessions through one reader, "
                    "interleaved turn by turn (a line a session, then one JSON line with the "
                    "prefix cache's hit rate and resident bytes)")
    rp.add_argument("--prefix", help="an agent's prefix file ({'system': str, 'tools': [...]}, "
                    "../shared/data/prefixes): its system text starts each session's system "
                    "message and its tools are the sessions' tools")
    rp.add_argument("--model", help="a HF model directory or random:NAME (default: a local "
                    "Qwen3.5-0.8B, else random:qwen3.5-0.8b on CUDA, random:tiny on the CPU)")
    rp.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    rp.add_argument("--grid", type=int, default=512, help="chunk length G (multiple of 64)")
    rp.add_argument("--question", help="a question JSON file (default: the 9-class router)")
    rp.add_argument("--check-exact", action="store_true",
                    help="compare the final committed state with a fresh prefill")
    rp.add_argument("--template", default="qwen3.5-27b",
                    help="the host's chat template (default: qwen3.5-27b, thinking on)")
    rp.add_argument("--template-dir", help="a model directory whose chat template the host uses")
    rp.add_argument("--no-thinking", action="store_true", help="the host runs with thinking off")
    rp.add_argument("--disk", type=Path, help="a folder for the disk tier (default: none)")
    rp.add_argument("--resident-mb", type=float, help="the resident cap in MiB (default: the "
                    "reader's, 4 GiB)")
    rp.set_defaults(func=replay_command)
    bp = sub.add_parser("bench", help="the read benchmark (read rate, chunk and question "
                        "latency, decode, the transformers peer, the GEMM floor)",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                        description="On a CPU, a smoke run: --model random:tiny --device cpu "
                        "--ids examples/session.json --max-context 2048 --grids 512 "
                        "--ask-at 1024,2048")
    bp.add_argument("--model", default="random:qwen3.5-0.8b", help="random:NAME or a directory")
    bp.add_argument("--device", choices=["cpu", "cuda"])
    bp.add_argument("--ids", nargs="+", default=_default_sessions(),
                    help=".npz (evals/session_ids.py) or session .json files, used in order")
    bp.add_argument("--max-context", type=int, default=32768, help="ids read from 0")
    bp.add_argument("--grids", type=lambda s: [int(x) for x in s.split(",")],
                    default=[512, 1024, 2048])
    bp.add_argument("--ask-at", type=lambda s: [int(x) for x in s.split(",")],
                    default=[8192, 32768, 102400],
                    help="question positions (those past --max-context are reported skipped)")
    bp.add_argument("--parts", default="read,exact,decode,ask,floor,grids,peer",
                    help="comma-separated parts to run (add eager: the eager path, no CUDA graphs)")
    bp.add_argument("--attn-tiling", help="the chunk runner's attention tiling BMxBNxWARPSxSTAGES"
                    " (default: attention.tiling.READ)")
    bp.add_argument("--attention", choices=["fa4", "table"],
                    help="the runners' attention on CUDA (default: fa4 where it runs, else table)")
    bp.add_argument("--out", help="also write the JSON object to this file")
    bp.set_defaults(func=_bench)
    fp = sub.add_parser("fresh", help="replay request timelines through the scheduler on "
                        "virtual time: how fresh the shadow stays, and what it costs the host")
    fp.add_argument("timelines", nargs="+", help="timeline JSON files (shared/data/timelines)")
    cost = fp.add_mutually_exclusive_group()
    cost.add_argument("--read-ms-per-1k", type=float, default=None,
                      help="one read cost for every context (ms per 1,000 ids)")
    cost.add_argument("--cost-model", help="a `shadow-reader bench` JSON (grid-512 read bands; "
                      "default: the latest H200 run of record shipped with the package, "
                      "evals/read_costs_h200.json)")
    fp.add_argument("--grid", type=int, default=512)
    fp.add_argument("--plot", help="write a PNG of one session's backlog over time here")
    fp.add_argument("--session", help="the session to plot (default: the one with most turns)")
    fp.add_argument("--agents", type=_counts, help="N,N,...: overlay N timelines on one "
                    "clock, one host with continuous batching, one shadow with the engine-wide "
                    "share; a table and a JSON line for each N (evals/fresh_agents.py)")
    fp.add_argument("--seed", type=int, default=0, help="with --agents: the offsets' seed")
    fp.add_argument("--window-s", type=float, help="with --agents: offsets uniform in "
                    "[0, this) s (default: the span of the rotation's first timeline)")
    fp.add_argument("--decode-alpha", type=float, default=0.08, help="with --agents: a decode "
                    "step of b requests takes step(1) x (1 + alpha (b - 1)) (evals/"
                    "fresh_agents.py, EngineModel, gives the source of 0.08)")
    fp.add_argument("--batch-sessions", type=int, help="the idle window reads one chunk of "
                    "each of up to this many sessions in one forward (1-64; default: "
                    "SHADOW_BATCH_SESSIONS, else 1); without --batch-costs a batch costs its "
                    "chunks one at a time")
    fp.add_argument("--batch-costs", metavar="FILE", help="with --agents: a forward of B "
                    "chunks costs their one-at-a-time sum times the batching's gain measured "
                    "by `python -m evals.bi_bench --parts chunks --out FILE` (one "
                    "forward's ms over one at a time's at B and the chunks' mean context, "
                    "interpolated; or --parts read's bi_batch / bi_alone; evals/"
                    "fresh_agents.py, batched_costs); needs --batch-sessions (or "
                    "SHADOW_BATCH_SESSIONS) > 1 and the bench's grid")
    fp.set_defaults(func=_fresh)
    hp = sub.add_parser("prefix-hits", add_help=False, help="one agent's sessions with its "
                        "prefix, alone and together: ids read, hit rate, bytes held "
                        "(evals/prefix_share.py; --help for its options)")
    hp.set_defaults(func=None)
    rp = sub.add_parser("router-eval", add_help=False, help="the router's class question at "
                        "each labelled turn against a JSON-lines file of labels, beside the "
                        "constant-label baseline (evals/router_eval.py; --help for its options)")
    rp.set_defaults(func=None)
    ep = sub.add_parser("export-model", help="write a preset's seeded random weights as a "
                        "Hugging Face directory (a host model for vLLM, e.g. random:tiny-host)")
    ep.add_argument("spec", help="random:NAME (tiny, tiny-host, qwen3.5-0.8b, -2b, -4b)")
    ep.add_argument("dir", help="the directory to write (config.json, model.safetensors)")
    ep.add_argument("--layout", choices=["released", "causal", "conditional"],
                    default="released", help="released (default): as Qwen's checkpoints, "
                    "Qwen3_5ForConditionalGeneration with a nested text_config (what vLLM "
                    "0.26+ loads, with --language-model-only); causal or conditional: those "
                    "tensor names with a flat config")
    ep.set_defaults(func=_export)
    from shadow_plugin.server.settings import help_text
    sp = sub.add_parser("serve", help="the HTTP service (FastAPI + uvicorn)", epilog=help_text(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sp.add_argument("--model", help="SHADOW_MODEL: a Qwen3.5 model directory or random:NAME")
    sp.add_argument("--device", choices=["cpu", "cuda"], help="SHADOW_DEVICE (default: cuda "
                    "when available)")
    sp.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; "
                    "another without a key gets a warning)")
    sp.add_argument("--port", type=_port, default=8765, help="1-65535 (default 8765)")
    sp.add_argument("--threads", type=int, help="SHADOW_THREADS: torch's CPU threads")
    sp.add_argument("--api-key", help="require this bearer key on every route but /healthz "
                    "and the dashboard's page (SHADOW_API_KEY keeps it out of ps)")
    sp.add_argument("--grid", type=int, help="SHADOW_GRID: the chunk length G, a multiple "
                    "of 64 (default 512)")
    sp.set_defaults(func=_serve)
    return ap


def _export(args) -> int:
    from adapters.model.export import export_preset
    print(export_preset(args.spec, Path(args.dir).expanduser(), args.layout))
    return 0


def _threads() -> int:
    """SHADOW_THREADS, else config.default_threads() (half the cores). ValueError for a value
    that is not a positive number."""
    from shadow_plugin.server.config import default_threads
    raw = os.environ.get("SHADOW_THREADS")
    if raw is None:
        return default_threads()
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"SHADOW_THREADS={raw!r}: a number of threads, 1 or more")
    return int(raw)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port {text!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--port {port}: must be within 1-65535")
    return port


def _serve(args) -> int:
    import uvicorn

    from shadow_plugin.server.app import create_app
    from shadow_plugin.server.config import ServiceConfig
    from shadow_plugin.server.startup import bind_check, startup_lines
    cfg = ServiceConfig.from_env().with_overrides(model=args.model, device=args.device,
                                                  api_key=args.api_key, grid=args.grid,
                                                  bind_host=args.host, threads=args.threads)
    app = create_app(cfg)                   # every setting checked: ValueError -> exit 2
    bind_check(args.host, args.port)        # the port taken or not ours: exit 2, no traceback
    for line in startup_lines(cfg, args.host, args.port):
        print(f"shadow-reader: {line}", file=sys.stderr, flush=True)
    # uvicorn raises the stop's signal again once it has shut down (SIGTERM: the process
    # would end "killed by signal 15" after a clean stop); handled here, the planned stop's
    # own result decides the exit status
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    failed = app.state.service.stop_write_errors
    if failed:
        print(f"shadow-reader: the stop failed to write {failed} files (see the log)",
              file=sys.stderr, flush=True)
    return 1 if failed else 0




def _fresh(args) -> int:
    from evals.fresh import cost_from_bench, fresh_report
    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    if args.grid < 64 or args.grid % 64:
        raise ValueError(f"--grid must be a positive multiple of 64, got {args.grid}")
    if args.read_ms_per_1k is not None and not args.read_ms_per_1k > 0:
        raise ValueError(f"--read-ms-per-1k must be > 0, got {args.read_ms_per_1k}")
    if args.read_ms_per_1k is not None:
        rate = args.read_ms_per_1k
        name, ms_per_1k = f"{rate} ms per 1,000 ids", (lambda c: rate)
    else:
        name, ms_per_1k = cost_from_bench(args.cost_model or RUN_OF_RECORD)
    print(f"read costs: {name}", file=sys.stderr)
    cfg = SchedulerConfig.from_env(grid=args.grid)
    if args.batch_sessions is not None:
        try:
            cfg = dataclasses.replace(cfg, batch_sessions=args.batch_sessions)
        except ValueError as e:
            raise ValueError(f"--batch-sessions: {e}") from None
    if args.batch_costs and not args.agents:
        raise ValueError("--batch-costs is for --agents N (the plain run costs a batch as its "
                         "chunks one at a time)")
    if args.agents:
        return _fresh_agents(args, cfg, name, ms_per_1k)
    res = fresh_report(args.timelines, cfg, name, ms_per_1k)
    if args.plot:
        from evals.fresh import load_timeline, plot_backlog
        shown = plot_backlog(load_timeline(args.timelines[0]), cfg, ms_per_1k, args.session,
                             args.plot)
        print(f"plot of session {shown} written to {args.plot}", file=sys.stderr)
    print("token counts are the timelines' own (other tokenizers), used as they are",
          file=sys.stderr)
    for arm in ("idle", "idle_ration"):
        print(f"{arm:>12}: " + ", ".join(f"{k} {v}" for k, v in res[arm].items()),
              file=sys.stderr)
    print(json.dumps(res))
    return 0


def _counts(text: str) -> list[int]:
    """`1,2,4`: positive counts, for argparse."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive counts like 1,2,4, got {text!r}")
    return out


def _fresh_agents(args, cfg, name: str, ms_per_1k) -> int:
    """`fresh --agents N,...`: the table, then the JSON line (evals/fresh_agents.py)."""
    from evals.fresh_agents import ONE_AT_A_TIME, EngineModel, agents_report, table
    if args.plot:
        raise ValueError("--plot draws one timeline: leave out --agents")
    model = EngineModel(decode_alpha=args.decode_alpha)
    chunk_ms, costs, said = None, ONE_AT_A_TIME, "one-at-a-time chunk costs"
    if args.batch_costs:
        chunk_ms, costs = _batch_costs(args.batch_costs, cfg, ms_per_1k)
        said = f"batched chunk costs from {args.batch_costs}, batches of up to " \
            f"{cfg.batch_sessions}"
    reused = [n for n in args.agents if n > len(args.timelines)]
    if reused:
        print(f"N = {', '.join(map(str, reused))} exceeds the {len(args.timelines)} timelines: "
              "they are reused with other offsets and their own session names", file=sys.stderr)
    res = agents_report(args.timelines, args.agents, cfg, name, ms_per_1k, model, args.seed,
                        args.window_s, chunk_ms, costs)
    print(f"simulation, {said}; token counts are the timelines' own", file=sys.stderr)
    print(table(res))
    print(json.dumps(res))
    return 0


def _batch_costs(path: str, cfg, ms_per_1k):
    """(chunk_ms, the report's "simulation" words) from a bi_bench JSON (--batch-costs).
    ValueError for batch_sessions 1, a file that is not JSON or has no usable rows."""
    from evals.fresh_agents import batch_part, batch_ratios, batched_costs
    if cfg.batch_sessions < 2:
        raise ValueError("--batch-costs prices batched forwards, but the scheduler reads one "
                         "chunk at a time: pass --batch-sessions N (2-64) or set "
                         "SHADOW_BATCH_SESSIONS")
    try:
        bench = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--batch-costs {path}: not JSON ({e})") from None
    try:
        chunk_ms = batched_costs(bench, ms_per_1k, cfg.grid)
    except ValueError as e:
        raise ValueError(f"--batch-costs {path}: {e}") from None
    if str(bench.get("gpu", "")).startswith("none"):
        print(f"--batch-costs {path}: a smoke run without CUDA, its times are no figures "
              "(evals/bi_bench.py)", file=sys.stderr)
    ratios = "; ".join(f"{c}: " + ", ".join(f"B={b} {r:.3f}" for b, r in rows)
                       for c, rows in batch_ratios(bench, cfg.grid).items())
    about = ", ".join(str(bench[k]) for k in ("gpu", "model", "date", "commit") if bench.get(k))
    ratio = "one forward's / one at a time's ms (the CUDA graphs' batched read)" \
        if batch_part(bench)[1] else "bi_batch / bi_alone ms"
    return chunk_ms, (f"batched chunk costs: a forward of B chunks costs their one-at-a-time "
                      f"sum times {ratio} at B and their mean context, "
                      f"interpolated, batches of up to {cfg.batch_sessions} sessions "
                      f"({path}{'; ' + about if about else ''}; ratio by context: {ratios})")


def _default_sessions() -> list[str]:
    """The shared data set's sessions (evals.data), longest first, when present."""
    d = data_dir() / "sessions"
    files = sorted(d.glob("*.json"), key=lambda p: -p.stat().st_size) if d.is_dir() else []
    return [str(p) for p in files]


def _bench(args) -> int:
    from evals.bench import run
    if not args.ids:
        raise ValueError("--ids: no session files given and none found beside the checkout")
    out = Path(args.out) if args.out else None
    if out is not None and not (out.parent.is_dir() and os.access(out.parent, os.W_OK)):
        raise ValueError(f"--out {args.out}: its folder does not exist or cannot be written")
    res = run(args)
    for key, value in res.items():
        print(f"{key:>32}  {value}", file=sys.stderr)
    line = json.dumps(res)
    print(line)                      # the result first: a failing write must not lose it
    if out is not None:
        out.write_text(line + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    try:
        torch.set_num_threads(_threads())      # torch would take every core (SHADOW_THREADS)
        if argv[:1] == ["prefix-hits"]:        # its own options: evals/prefix_share.py
            from evals.prefix_share import main as prefix_hits
            return prefix_hits(argv[1:], prog="shadow-reader prefix-hits")
        if argv[:1] == ["router-eval"]:        # its own options: evals/router_eval.py
            from evals.router_eval import main as router_eval
            return router_eval(argv[1:], prog="shadow-reader router-eval")
        args = build_parser().parse_args(argv)
        return args.func(args)
    except TemplateError as e:
        print(f"shadow-reader: error: chat template: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, OSError, ImportError) as e:
        print(f"shadow-reader: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
