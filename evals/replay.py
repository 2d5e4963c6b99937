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
from shadow_plugin.host_view import HostTurn, host_turns
from shadow_plugin.reader import Reader
from shadow_plugin.router import Question

PROGRESS_CHUNKS = 16          # show a progress bar when a turn reads more chunks than this


@dataclass
class Totals:
    """The replay's totals (the JSON line): see `as_dict`."""

    turns: int = 0
    num_ids: int = 0
    num_read: int = 0
    num_reread: int = 0
    read_ms: float = 0.0
    rollbacks: int = 0
    rewrites_bpe: int = 0          # same text, other tokens (a BPE merge across a boundary)
    rewrites_template: int = 0     # other text (the template dropped earlier reasoning)
    ask_ms: list[float] = field(default_factory=list)
    exact: bool | None = None

    def as_dict(self) -> dict:
        return {"turns": self.turns, "num_ids": self.num_ids, "num_read": self.num_read,
                "num_reread": self.num_reread, "read_ms": round(self.read_ms, 1),
                "ask_ms_mean": round(statistics.fmean(self.ask_ms), 2) if self.ask_ms else None,
                "ask_ms_max": round(max(self.ask_ms), 2) if self.ask_ms else None,
                "rollbacks": self.rollbacks, "rewrites_bpe": self.rewrites_bpe,
                "rewrites_template": self.rewrites_template, "exact": self.exact}


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


def _count_rewrite(totals: Totals, d: int, held: list[int], prompt: list[int], tokenizer) -> None:
    """Classify a prompt that differs from the held ids at d < len(held): a BPE rewrite when the
    held ids' text from d on is still the start of the new prompt's text from d on."""
    if d >= len(held):
        return
    if tokenizer.decode(prompt[d:]).startswith(tokenizer.decode(held[d:])):
        totals.rewrites_bpe += 1
    else:
        totals.rewrites_template += 1


def replay_turns(reader: Reader, sid: str, turns: list[HostTurn], question: Question,
                 tokenizer, check_exact: bool = False, out=sys.stdout) -> Totals:
    """Run the turns through `reader` as session `sid`; print a row a turn to `out` (None:
    silent). Returns the totals; `exact` is None unless `check_exact`."""
    totals = Totals()
    if out:
        print(HEADER, file=out)
    held: list[int] = []
    for n, turn in enumerate(turns):
        res = reader.feed(sid, turn.prompt_ids, "prompt")
        _count_rewrite(totals, res.first_difference, held, turn.prompt_ids, tokenizer)
        rollback = "-"
        if res.rolled_back_to is not None:
            totals.rollbacks += 1
            totals.num_reread += res.rolled_back_from - res.rolled_back_to
            rollback = f"{res.rolled_back_from}->{res.rolled_back_to}"
        num, ms = _read_all(reader, sid, out)
        totals.num_read += num
        totals.read_ms += ms
        reader.feed(sid, turn.output_ids, "output")
        ans = reader.ask(sid, question.question, list(question.choices))
        totals.ask_ms.append(ans.ms)
        totals.num_read += ans.num_committed
        num += ans.num_committed
        label = question.labels[question.choices.index(ans.label)]
        if out:
            print(f"{n:>4} {len(turn.prompt_ids):>7} {num:>6} {rollback:>15} {ms:>8.1f} "
                  f"{reader.committed(sid):>7} {reader.backlog(sid):>5} "
                  f"{len(reader.checkpoint_positions(sid)):>4}  {label:<12} "
                  f"{max(ans.probs):>5.2f} {ans.ms:>7.1f}", file=out, flush=True)
        held = reader.ids(sid)
    totals.turns = len(turns)
    totals.num_ids = len(reader.ids(sid)) if turns else 0
    if check_exact and turns:
        totals.exact = reader.check_exact(sid)
    return totals


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
