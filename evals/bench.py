"""The read benchmark (issue 5): read rate per context band and grid, per-chunk latency,
question latency, fork decode, the transformers peer, the dense-GEMM floor, exactness after the
timed runs, and how far answers move between grids. `shadow-reader bench`.

Ids come from real sessions (.npz files of evals/session_ids.py, or session JSON files
tokenised here), concatenated until the longest context. Times are device times (CUDA events)
on CUDA and wall times on the CPU. Prints a table and, last, one JSON object.
"""
from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from adapters.model import load_model
from evals.timing import device_ms
from shadow_plugin.chat.router import ROUTER
from shadow_plugin.reader.reader import Reader

BANDS = ((0, 8192), (8192, 32768), (32768, 65536), (65536, 102400))
KNOWN_PARTS = {"read", "exact", "decode", "ask", "floor", "grids", "peer", "graphs", "eager"}


def device_timer(device: torch.device) -> Callable:
    """timing.device_ms for this device: fn -> (fn(), ms), CUDA events on CUDA, the clock on
    the CPU (also on a machine with a GPU)."""
    return functools.partial(device_ms, cuda=device.type == "cuda")


def _label(at: int) -> str:
    """'32k' for 32,768; '5000' for 5,000 (a position that is not a whole k)."""
    return f"{at // 1024}k" if at % 1024 == 0 else str(at)


def load_ids(paths: list[str], num_ids: int) -> list[int]:
    """Concatenated ids of the given sessions (.npz ids or .json sessions), first num_ids."""
    ids: list[int] = []
    tok = None
    for p in paths:
        if p.endswith(".npz"):
            ids += np.load(p)["ids"].tolist()
        else:
            from shadow_plugin.chat.tokenizer import load_tokenizer
            tok = tok or load_tokenizer()
            try:
                msgs = json.loads(Path(p).read_text())["messages"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{p}: not a session (a .npz of ids, or a JSON object with "
                                 f"\"messages\", as in shared/data/sessions)") from None
            text = "\n".join(str(m.get("content") or "") for m in msgs)
            ids += tok.encode(text)
        if len(ids) >= num_ids:
            break
    if len(ids) < num_ids:
        raise ValueError(f"the sessions hold {len(ids)} ids, {num_ids} asked for (--max-context "
                         f"plus 1,024): give more sessions with --ids or a smaller --max-context")
    return ids[:num_ids]


def unshared(ids: list[int], salt: int = 1) -> list[int]:
    """ids with the first one changed: every page key differs, so a reader that read `ids`
    already shares none of its pages (what a timed read must not resume from)."""
    return [(ids[0] + salt) % 240000] + list(ids[1:])


def read_rates(reader: Reader, ids: list[int], timer: Callable) -> list[tuple[int, float]]:
    """(context at the chunk's start, ms) for every chunk of reading ids from 0."""
    reader.feed("bench", ids, "prompt")
    out = []
    while reader.backlog("bench") >= reader.config.grid:
        c = reader.committed("bench")
        _, ms = timer(lambda: reader.read("bench", max_chunks=1))
        out.append((c, ms))
    return out


def backlog_rates(reader: Reader, ids: list[int], timer: Callable) -> dict[str, float]:
    """ms per 1,000 ids per context band when each band is read as one backlog (one
    Reader.read call: the chunks queued back to back, one device sync at the end, as a reader
    catches up), and '0k-32k' over the first 32k; against read_rates, which syncs after every
    chunk (what the idle window and the ration do, checking the host before each chunk)."""
    reader.feed("backlog", unshared(ids, 2), "prompt")
    grid, out, total = reader.config.grid, {}, []
    for lo, hi in BANDS:
        n = (min(hi, len(ids)) - lo) // grid
        if n < 1:
            break
        _, ms = timer(lambda: reader.read("backlog", max_chunks=n))
        out[f"{lo // 1024}k-{hi // 1024}k"] = round(ms / (n * grid) * 1000, 2)
        if hi <= 32768:
            total.append((ms, n))
    if total:
        out["0k-32k"] = round(sum(m for m, _ in total) / sum(n for _, n in total) / grid * 1000, 2)
    reader.drop("backlog")
    return out


def band_rates(chunks: list[tuple[int, float]], grid: int) -> dict[str, float]:
    """ms per 1,000 ids for each context band that has chunks."""
    out = {}
    for lo, hi in BANDS:
        sel = [ms for c, ms in chunks if lo <= c < hi]
        if sel:
            out[f"{lo // 1024}k-{hi // 1024}k"] = round(sum(sel) / (len(sel) * grid) * 1000, 2)
    return out


def chunk_points(chunks: list[tuple[int, float]]) -> dict:
    """At 8k, 16k, 32k, 64k and 96k: `chunk_ms`, the median of the chunks that start in the
    2,048 ids after the point, and `first_chunk_ms`, the chunk at the point itself (with pages,
    a chunk that grows the pool copies it: not at these points, but kept for comparison with
    the contiguous buffers' growth chunks of earlier runs)."""
    at = dict(chunks)
    typical, first = {}, {}
    for p in (8192, 16384, 32768, 65536, 98304):
        sel = [ms for c, ms in chunks if p < c < p + 2048]
        if sel:
            typical[f"{p // 1024}k"] = round(statistics.median(sel), 2)
        if p in at:
            first[f"{p // 1024}k"] = round(at[p], 2)
    return {"chunk_ms": typical, "first_chunk_ms": first}


def ask_latency(reader: Reader, ids: list[int], at: int, repeats: int = 5) -> float:
    """Median ms of the router question with C = at and a 330-id pending tail (the seed's
    measurement). The session 'ask' grows append-only, so calls go in increasing `at`."""
    reader.feed("ask", ids[:at + 330], "prompt")
    reader.read("ask")
    reader.ask("ask", ROUTER.question, list(ROUTER.choices))               # warm-up
    return statistics.median(reader.ask("ask", ROUTER.question, list(ROUTER.choices)).ms
                             for _ in range(repeats))


def decode_ms(reader: Reader, num_tokens: int = 32) -> float:
    """Fork decode ms per token on top of the session 'bench' as it stands."""
    reader.generate("bench", "Summarize the session.", max_new_tokens=4, stop_ids=())
    return reader.generate("bench", "Summarize the session.", max_new_tokens=num_tokens,
                           stop_ids=()).ms_per_token


def gemm_floor_ms(model, grid: int, timer: Callable) -> float:
    """Device time of one chunk's dense projections alone, as the runners do them (model.fuse:
    one GEMM for the projections that share an input; every other nn.Linear of the layers, the
    lm_head excluded) on random [grid, in_features] inputs, in a CUDA graph on CUDA."""
    from adapters.model.fuse import fuse_projections
    f = fuse_projections(model)
    weights = [*f.gdn_in.values(), *f.attn_in.values(), *f.mlp_in.values()]
    weights += [m.weight for layer in model.layers for name, m in layer.named_modules()
                if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in
                ("out_proj", "o_proj", "down_proj")]
    xs = [torch.randn(grid, w.shape[1], device=model.device, dtype=model.dtype) for w in weights]

    def run():
        for w, x in zip(weights, xs):
            torch.nn.functional.linear(x, w)
    run()
    if model.device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        graph.replay()
        return statistics.median(timer(graph.replay)[1] for _ in range(10))
    return statistics.median(timer(run)[1] for _ in range(3))


def grid_movement(model, ids: list[int], positions: list[int]) -> dict:
    """Top-letter agreement and max KL(p512 || p2048) of the router question between grids."""
    r1, r2 = Reader(model, grid=512), Reader(model, grid=2048)
    for r in (r1, r2):
        r.feed("g", ids, "prompt")
    same, kls = 0, []
    for at in positions:
        p = torch.tensor(r1.ask("g", ROUTER.question, list(ROUTER.choices), at=at).probs)
        q = torch.tensor(r2.ask("g", ROUTER.question, list(ROUTER.choices), at=at).probs)
        same += int(p.argmax() == q.argmax())
        kls.append(float((p * (p / q).log()).sum()))
    return {"questions": len(positions), "top_letter_same": same, "kl_max": max(kls)}


def versions() -> dict:
    out = {"torch": torch.__version__, "date": datetime.date.today().isoformat()}
    for name in ("triton", "fla", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except Exception as e:                   # absent on the CPU: reported, not fatal
            out[name] = f"missing ({type(e).__name__})"
    try:
        out["flash_attn_4"] = importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        out["flash_attn_4"] = "missing"
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return out


def _part(res: dict, key: str, fn) -> None:
    """Run one part; a failure is recorded under `key` (and the run goes on to the next part)."""
    try:
        res[key] = fn()
    except Exception as e:                       # a benchmark reports, it does not stop
        res[key] = f"failed: {type(e).__name__}: {e}"[:500]


def attn_split(args):
    """--attn-tiling BMxBNxWARPSxSTAGES as an attention.tiling.SplitConfig (None: the default)."""
    if not getattr(args, "attn_tiling", None):
        return None
    from adapters.attention.tiling import SplitConfig
    return SplitConfig.parse(args.attn_tiling)


def _read_part(model, grid: int, ids: list[int], args, parts: set[str], timer,
               graphs: bool = False) -> dict:
    reader = Reader(model, grid=grid, cuda_graphs=graphs,     # the eager path unless graphs
                    attn_split=attn_split(args), attention=getattr(args, "attention", None))
    read_rates(reader, unshared(ids[:2 * grid], 3), timer)   # warm-up: graphs, compiles
    reader.drop("bench")
    chunks = read_rates(reader, ids[:args.max_context], timer)
    out = {"path": reader.path, "ms_per_1k": band_rates(chunks, grid),
           "ms_per_1k_backlog": backlog_rates(reader, ids[:args.max_context], timer),
           **chunk_points(chunks),
           "series": [[c, round(ms, 3)] for c, ms in chunks]}     # (context, ms) per chunk
    if "exact" in parts:
        out["exact_after_timed_runs"] = reader.check_exact("bench")
    if "decode" in parts and grid == args.grids[0]:
        out["decode_ms_per_token"] = round(decode_ms(reader), 2)
    return out


def run(args) -> dict:
    """Run the parts named in args.parts; returns the JSON object (also printed by main)."""
    parts = set(args.parts.split(","))
    unknown = parts - KNOWN_PARTS
    if unknown:
        raise ValueError(f"--parts: unknown {sorted(unknown)} (known: {sorted(KNOWN_PARTS)})")
    bad = [g for g in args.grids if g < 64 or g % 64]
    if bad or args.max_context < max(args.grids):
        raise ValueError(f"--grids must be positive multiples of 64 (got {args.grids}) and "
                         f"--max-context at least the largest (got {args.max_context})")
    if getattr(args, "attn_tiling", None) and getattr(args, "attention", None) not in (None,
                                                                                   "table"):
        raise ValueError(f"--attn-tiling is the table attention's, not --attention "
                         f"{args.attention}")
    if any(a < 1 for a in args.ask_at):
        raise ValueError(f"--ask-at positions must be >= 1, got {args.ask_at}")
    ids = load_ids(args.ids, args.max_context + 1024)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    graphs = device.type == "cuda" and "eager" not in parts     # the reader's default path
    if not graphs and (getattr(args, "attention", None) or getattr(args, "attn_tiling", None)):
        raise ValueError("--attention and --attn-tiling choose the CUDA-graph runners' "
                         "attention; this run reads eagerly (the CPU, or --parts eager)")
    split = attn_split(args)
    model = load_model(args.model, device=device)
    timer = device_timer(device)
    res = {"model": args.model, "dtype": str(model.dtype).removeprefix("torch."),
           "kernels": model.kernels.name, "max_context": args.max_context,
           "attn_tiling": getattr(args, "attn_tiling", None) or "default",
           "attention": getattr(args, "attention", None) or "default", **versions()}
    res["path"] = "cuda_graphs" if graphs else "eager"
    if "read" in parts or "graphs" in parts:
        for grid in args.grids:
            _part(res, f"read_grid{grid}",
                  lambda: _read_part(model, grid, ids, args, parts, timer, graphs=graphs))
    if "ask" in parts:
        reader = Reader(model, grid=args.grids[0], cuda_graphs=graphs, attn_split=split,
                        attention=getattr(args, "attention", None))
        _part(res, "ask_ms", lambda: {_label(at): round(ask_latency(reader, ids, at), 2)
                                      if at <= args.max_context else "skipped: past --max-context"
                                      for at in sorted(args.ask_at)})
    if "floor" in parts:
        _part(res, "gemm_floor_ms_per_chunk",
              lambda: round(gemm_floor_ms(model, args.grids[0], timer), 3))
    if "grids" in parts:
        n = min(args.max_context, 32768)
        _part(res, "grid_512_vs_2048",
              lambda: grid_movement(model, ids[:n], [n * k // 8 for k in range(1, 9)]))
    if "peer" in parts:
        from evals.peer import transformers_read_ms_per_1k
        n = min(args.max_context, 32768)
        _part(res, "peer_transformers_ms_per_1k", lambda: transformers_read_ms_per_1k(
            args.model, device, ids[:n], args.grids[0], timer))
    return res
