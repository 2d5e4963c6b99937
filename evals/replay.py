"""Replay a recorded session through the reader, turn by turn, as its host would have served it.

Per assistant turn: feed the prompt (a rewrite goes through the rollback path), read all whole
chunks (with a progress bar when long), feed the output, ask the question. One row a turn; the
totals as one JSON object. Used by `shadow-reader replay`.
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from shadow_plugin import validate
from shadow_plugin.chat.host_view import HostTurn, host_turns
from shadow_plugin.chat.router import Question
from shadow_plugin.reader.reader import Reader

PROGRESS_CHUNKS = 16          # show a progress bar when a turn reads more chunks than this


@dataclass
class Totals:
    """The replay's totals (the JSON line): see `as_dict`."""

    turns: int = 0
    num_ids: int = 0
    num_read: int = 0
    num_reread: int = 0            # ids read again below the furthest C (the reader's
    num_reread_bpe: int = 0        # reread_tokens counter), of them after BPE rewrites
    num_reread_template: int = 0   # and after template rewrites
    num_rolled_back: int = 0       # ids C gave back in rollbacks (one session alone: C +
    #                                this = num_read, when no resume jumps C forward)
    read_ms: float = 0.0
    rollbacks: int = 0
    rewrites_bpe: int = 0          # same text, other tokens (a BPE merge across a boundary)
    rewrites_template: int = 0     # other text (the template dropped earlier reasoning)
    ask_ms: list[float] = field(default_factory=list)
    exact: bool | None = None
    furthest: int = 0              # the furthest C the session committed so far
    rewrites: list[dict] = field(default_factory=list)     # one record a rewrite (see below)

    def as_dict(self) -> dict:
        return {"turns": self.turns, "num_ids": self.num_ids, "num_read": self.num_read,
                "num_reread": self.num_reread, "num_reread_bpe": self.num_reread_bpe,
                "num_reread_template": self.num_reread_template,
                "num_rolled_back": self.num_rolled_back, "read_ms": round(self.read_ms, 1),
                "ask_ms_mean": round(statistics.fmean(self.ask_ms), 2) if self.ask_ms else None,
                "ask_ms_max": round(max(self.ask_ms), 2) if self.ask_ms else None,
                "rollbacks": self.rollbacks, "rewrites_bpe": self.rewrites_bpe,
                "rewrites_template": self.rewrites_template, **bound_summary(self.rewrites),
                "exact": self.exact}


def bound_summary(rewrites: list[dict]) -> dict:
    """Issue 16's re-read targets over the rewrite records, as issue 33 states them with
    questions: every rewrite re-reads at most the ids from its first difference d to the
    furthest C (`changed`: they differ, or follow a difference, so any policy reads them
    again) plus one page below d (what the checkpoints and the tip ring decide). Without
    questions a BPE-boundary rewrite has nothing changed below the furthest C (C stood at or
    below d), so its bound is one page, issue 16's; a question at the end of the ids commits
    the output's whole chunks, which the next prompt's merge at the previous prompt's end then
    changes. The worst of each kind and the records past the bound."""
    out = {}
    for kind in ("bpe", "template"):
        rows = [r for r in rewrites if (r["cause"] == "bpe") == (kind == "bpe")]
        out[f"max_reread_{kind}"] = max((r["reread"] for r in rows), default=0)
        out[f"num_over_bound_{kind}"] = sum(not r["within"] for r in rows)
    # what the policy decides: ids re-read below the first difference (at most one page when
    # the line at or below it is held), and the changed ids a question had committed
    out["max_reread_below_difference"] = max(
        (r["reread"] - r["changed"] for r in rewrites), default=0)
    out["num_reread_changed"] = sum(min(r["reread"], r["changed"]) for r in rewrites)
    return out


HEADER = (f"{'turn':>4} {'prompt':>7} {'read':>6} {'rollback':>15} {'read ms':>8} {'C':>7} "
          f"{'tail':>5} {'ckpt':>4}  {'answer':<12} {'p':>5} {'ask ms':>7}")


def _read_all(reader: Reader, sid: str, out) -> tuple[int, float]:
    """Read every whole chunk of `sid`, with a tqdm bar on stderr when there are many."""
    grid = reader.config.grid
    chunks = reader.backlog(sid) // grid
    if chunks <= PROGRESS_CHUNKS:
        r = reader.read(sid)
        return r.num_read_tokens, r.ms
    num, ms = 0, 0.0
    with tqdm(total=chunks * grid, unit="id", desc="reading", leave=False, file=sys.stderr,
              disable=out is None) as bar:
        while reader.backlog(sid) >= grid:
            r = reader.read(sid, max_chunks=4)
            num, ms = num + r.num_read_tokens, ms + r.ms
            bar.update(r.num_read_tokens)
    return num, ms


def replay_turn(reader: Reader, sid: str, n: int, turn: HostTurn, question: Question,
                totals: Totals, out=sys.stdout) -> None:
    """Turn n of session `sid`: feed the prompt (a rewrite goes through the lookup; its kind,
    reader.FeedResult.rewrite, is counted with the ids it sends back to be read again), read
    all whole chunks, feed the output, ask (question None: no ask, no row); print its row to
    `out` (None: silent). A rewrite's record (Totals.rewrites): the turn, its cause, first
    difference d, the furthest C before it, the line it resumed at, the ids read again below
    that furthest C during the turn (the reader's reread counter), and whether they are
    within bound_summary's bound (`changed`: the ids from d to that furthest C). The totals'
    num_reread (by cause) are that counter's
    increments over the turn; num_rolled_back the ids C gave back."""
    counters = reader.table.counters
    reread_before = dict(counters.reread_tokens)
    _turn(reader, sid, n, turn, question, totals, out, reread_before)
    delta = {c: ids - reread_before.get(c, 0) for c, ids in counters.reread_tokens.items()}
    totals.num_reread += sum(delta.values())       # the turn's: the reader reads no other
    totals.num_reread_bpe += delta.get("bpe", 0)
    totals.num_reread_template += delta.get("template", 0)


def _turn(reader: Reader, sid: str, n: int, turn: HostTurn, question: Question,
          totals: Totals, out, reread_before: dict) -> None:
    counters = reader.table.counters
    res = reader.feed(sid, turn.prompt_ids, "prompt")
    if res.rewrite == "bpe":
        totals.rewrites_bpe += 1
    elif res.rewrite is not None:
        totals.rewrites_template += 1
    rollback = "-"
    if res.rolled_back_to is not None:
        totals.rollbacks += 1
        totals.num_rolled_back += res.rolled_back_from - res.rolled_back_to
        rollback = f"{res.rolled_back_from}->{res.rolled_back_to}"
    num, ms = _read_all(reader, sid, out)
    totals.num_read += num
    totals.read_ms += ms
    if res.rewrite is not None:
        _record_rewrite(reader, totals, n, res, sum(counters.reread_tokens.values())
                        - sum(reread_before.values()))
    totals.furthest = max(totals.furthest, reader.committed(sid))
    reader.feed(sid, turn.output_ids, "output")
    if question is None:                 # reads only (what sharing measurements need)
        return
    ans = reader.ask(sid, question.question, list(question.choices))
    totals.ask_ms.append(ans.ms)
    totals.num_read += ans.num_committed
    totals.furthest = max(totals.furthest, reader.committed(sid))   # the ask's catch-up
    num += ans.num_committed
    label = question.labels[question.choices.index(ans.label)]
    if out:
        print(f"{n:>4} {len(turn.prompt_ids):>7} {num:>6} {rollback:>15} {ms:>8.1f} "
              f"{reader.committed(sid):>7} {reader.backlog(sid):>5} "
              f"{len(reader.checkpoint_positions(sid)):>4}  {label:<12} "
              f"{max(ans.probs):>5.2f} {ans.ms:>7.1f}", file=out, flush=True)


def _record_rewrite(reader: Reader, totals: Totals, n: int, res, reread: int) -> None:
    g, d, f = reader.config.grid, res.first_difference, totals.furthest
    changed = max(0, f - d)
    bound = changed + g
    resumed = res.rolled_back_to if res.rolled_back_to is not None else None
    totals.rewrites.append({"turn": n, "cause": res.rewrite, "first_difference": d,
                            "furthest": f, "resumed_at": resumed, "reread": reread,
                            "changed": changed, "bound": bound, "within": reread <= bound})


def replay_turns(reader: Reader, sid: str, turns: list[HostTurn], question: Question,
                 tokenizer=None, check_exact: bool = False, out=sys.stdout) -> Totals:
    """Run the turns through `reader` as session `sid`; print a row a turn to `out` (None:
    silent). Returns the totals; `exact` is None unless `check_exact`. (tokenizer: unused,
    kept for callers; the reader classifies rewrites with its own.)"""
    totals = Totals()
    if out:
        print(HEADER, file=out)
    for n, turn in enumerate(turns):
        replay_turn(reader, sid, n, turn, question, totals, out)
    _finish(reader, sid, turns, totals, check_exact)
    return totals


def _finish(reader: Reader, sid: str, turns: list, totals: Totals, check_exact: bool) -> None:
    totals.turns = len(turns)
    totals.num_ids = len(reader.ids(sid)) if turns else 0
    if check_exact and turns:
        totals.exact = reader.check_exact(sid)


def replay_many(reader: Reader, sessions: list[tuple[str, list[HostTurn]]],
                question: Question | None, check_exact: bool = False, out=sys.stdout) -> dict:
    """Several sessions of one agent through one reader, interleaved turn by turn (turn 0 of
    each, then turn 1 of each, ...). Prints a line per session (ids read, ids held, C) and
    returns {"sessions": {sid: Totals.as_dict() + committed (C)}, "prefix_cache_hit_rate" (ids
    resumed from held pages and state over prompt ids looked up, as vLLM counts it: a
    session's own earlier turns count too; what sharing saves is each session's ids read here
    against alone, evals/prefix_share.py), "read_tokens", "reread_tokens" (by cause),
    "resident_bytes", "pages", "gdn_entry_bytes", "gdn_entries_by_kind", "gdn_entry_hits"
    (since start, by kind)}."""
    totals = {sid: Totals() for sid, _ in sessions}
    for n in range(max((len(t) for _, t in sessions), default=0)):
        for sid, turns in sessions:
            if n < len(turns):
                replay_turn(reader, sid, n, turns[n], question, totals[sid], None)
    per = {}
    for sid, turns in sessions:
        _finish(reader, sid, turns, totals[sid], check_exact)
        per[sid] = {**totals[sid].as_dict(), "committed": reader.committed(sid) if turns else 0}
        if out:
            print(f"{sid}: read {totals[sid].num_read} ids (re-read {totals[sid].num_reread}); "
                  f"holds {per[sid]['num_ids']} ids, {per[sid]['committed']} of them read "
                  f"into state (C)", file=out)
    s = reader.stats()
    queried = s["prefix_cache_queried_tokens"]
    hits = sum(s["prefix_cache_hit_tokens"].values())
    return {"sessions": per, "prefix_cache_hit_rate": round(hits / queried, 4) if queried else 0.0,
            "prefix_cache_queried_tokens": queried, "prefix_cache_hit_tokens": hits,
            "read_tokens": s["read_tokens"], "reread_tokens": s["reread_tokens"],
            "resident_bytes": s["resident_bytes"], "pages": s["pages"],
            "page_bytes": s["page_bytes"], "gdn_entry_bytes": s["gdn_entry_bytes"],
            "gdn_entries_by_kind": s["gdn_entries_by_kind"],
            "gdn_entry_hits": s["gdn_entry_hits"]}


def load_prefix(path: str | Path) -> tuple[str, list]:
    """(system text, tools) of an agent's prefix file (../shared/data/prefixes: {"system": str,
    "tools": [...]}). Raises ValueError for a file of another shape."""
    raw = validate.json_file(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("system"), str) or \
            not isinstance(raw.get("tools"), list):
        raise ValueError(f"{path}: expected an object with a 'system' text and a 'tools' list")
    return raw["system"], raw["tools"]


def with_prefix(messages: list[dict], prefix: tuple[str, list]) -> tuple[list[dict], list]:
    """The session as the agent would have sent it: the prefix's system text starts the one
    system message (the session's own system message, if any, follows it in the same message,
    after a blank line) and the prefix's tools are the session's tools."""
    system, tools = prefix
    rest = list(messages)
    if rest and rest[0].get("role") == "system":
        own = rest.pop(0).get("content") or ""
        own = own if isinstance(own, str) else "".join(
            p.get("text", "") for p in own if isinstance(p, dict))
        system = f"{system}\n\n{own}" if own else system
    return [{"role": "system", "content": system}] + rest, list(tools)


def load_session(path: str | Path) -> tuple[list[dict], list]:
    """(messages, tools) of a session file ({"messages": [...], "tools": [...]}).
    Raises ValueError for a file without a messages list."""
    raw = validate.json_file(path)
    if not isinstance(raw, dict) or not isinstance(raw.get("messages"), list):
        raise ValueError(f"{path}: expected an object with a 'messages' list")
    for i, m in enumerate(raw["messages"]):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{path}: messages[{i}] must be an object with a 'role'")
    tools = raw.get("tools") or []
    if not isinstance(tools, list):
        raise ValueError(f"{path}: 'tools' must be a list")
    return raw["messages"], tools


def replay_file(reader: Reader, path, renderer, tokenizer, question: Question,
                check_exact: bool, enable_thinking=None, out=sys.stdout,
                messages=None, tools=None) -> Totals:
    """Replay a session file (or its already loaded `messages` and `tools`)."""
    if messages is None:
        messages, tools = load_session(path)
    turns = host_turns(messages, tools or None, renderer, tokenizer, enable_thinking)
    if not turns:
        print(f"{path}: no assistant message after the first: nothing to replay",
              file=sys.stderr)
    return replay_turns(reader, Path(path).stem, turns, question, tokenizer, check_exact, out)
