"""router-eval: the router's class question at each labelled turn's insertion point against
labels a user gives, with the constant-label baseline beside it (issue 18, item 4).

    shadow-reader router-eval LABELS.jsonl [--model DIR | random:NAME] [--device cpu|cuda]
        [--grid 512] [--question q.json] [--prefix AGENT.json] [--template NAME]
        [--template-dir DIR] [--no-thinking]

LABELS.jsonl has one object a line: {"session": FILE, "turn": N, "label": CLASS}. FILE is a
session JSON as `replay` takes it (a path relative to the labels file's folder, or absolute);
N is the turn as `replay` numbers it (0 = the first assistant message that is not the
session's first message; the service's router journal counts the turns it asked about from
1 instead); CLASS one of the question's labels (the 9 router classes by default:
shadow_plugin.chat.router.ROUTER). Every line, session file and turn is checked before the model
loads.
Each session is followed as its host served it (turns rendered and tokenised as in `replay`):
a labelled turn's prompt is fed, its whole chunks read up to the insertion point (after the
prompt's last <|im_end|>, where the service's router asks: server.router_journal), the question
asked there, then the rest read and the output fed. Nothing past a session's last labelled turn
is read.

Prints one row a labelled turn, then (on stderr) the accuracy against the baseline; the last
line is one JSON object: accuracy, the baseline (always the most frequent label, the earlier
in the question's order on a tie; its accuracy is that label's share), per-class counts
(labelled, predicted, right), the confusion matrix, the files used, model, device, grid, dtype,
versions and date. The model defaults as `replay`'s: a real Qwen3.5-0.8B in the Hugging Face
cache, else random weights, whose answers are meaningless (it says so: the CPU smoke test
checks the plumbing, a real checkpoint the router).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections import Counter
from pathlib import Path

import torch

from adapters.model import load_model
from evals.data import default_model
from evals.replay import load_prefix, load_session, with_prefix
from shadow_plugin.chat.host_view import HostTurn, host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.router import Question, load_question
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader
from shadow_plugin.reader.step import ReaderConfig
from shadow_plugin.server.router_journal import insertion_point


def load_labels(path: str | Path, question: Question) -> list[dict]:
    """The labels file's lines as {"session": Path, "turn": int, "label": str, "line": int}.
    Raises ValueError naming the line: not a JSON object, a missing field, a turn that is not
    an integer >= 0, a label outside the question's, a session labelled twice at one turn."""
    path, out, seen = Path(path), [], set()
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not {"session", "turn", "label"} <= set(row):
            raise ValueError(f"{path}:{n}: expected {{\"session\", \"turn\", \"label\"}}")
        if not isinstance(row["session"], str) or not row["session"]:
            raise ValueError(f"{path}:{n}: session must be a file name, got {row['session']!r}")
        turn = row["turn"]
        if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
            raise ValueError(f"{path}:{n}: turn must be an integer >= 0, got {turn!r}")
        if row["label"] not in question.labels:
            raise ValueError(f"{path}:{n}: label {row['label']!r} is not one of "
                             f"{', '.join(question.labels)}")
        session = Path(row["session"]).expanduser()
        session = (session if session.is_absolute() else path.parent / session).resolve()
        if (session, turn) in seen:
            raise ValueError(f"{path}:{n}: {row['session']} turn {turn} is labelled twice")
        seen.add((session, turn))
        out.append({"session": session, "turn": turn, "label": row["label"], "line": n})
    if not out:
        raise ValueError(f"{path}: no labels")
    return out


def ask_at_turns(reader: Reader, sid: str, turns: list[HostTurn], wanted: set[int],
                 question: Question) -> dict[int, tuple[str, float]]:
    """Follow the session through its turns up to the last one in `wanted`; at each wanted
    turn ask `question` at the prompt's insertion point. Returns {turn: (label, p)}."""
    grid, out = reader.config.grid, {}
    for n, turn in enumerate(turns[:max(wanted) + 1]):
        reader.feed(sid, turn.prompt_ids, "prompt")
        if n in wanted:
            at = insertion_point(turn.prompt_ids)
            need = (at // grid * grid - reader.committed(sid)) // grid
            if need > 0:
                reader.read(sid, max_chunks=need)
            ans = reader.ask(sid, question.question, list(question.choices), at=at)
            out[n] = (question.labels[question.choices.index(ans.label)], max(ans.probs))
        reader.read(sid)
        reader.feed(sid, turn.output_ids, "output")
    return out


def score(rows: list[dict], labels: tuple[str, ...]) -> dict:
    """Accuracy, the constant-label baseline, per-class counts and the confusion matrix
    (true label -> predicted label -> count) of rows with "label" and "predicted"."""
    n = len(rows)
    right = sum(r["label"] == r["predicted"] for r in rows)
    counts = Counter(r["label"] for r in rows)
    base, base_n = max(counts.items(), key=lambda kv: (kv[1], -labels.index(kv[0])))
    per = {c: {"labelled": counts.get(c, 0),
               "predicted": sum(r["predicted"] == c for r in rows),
               "right": sum(r["label"] == c == r["predicted"] for r in rows)} for c in labels}
    confusion = {c: dict(Counter(r["predicted"] for r in rows if r["label"] == c))
                 for c in labels if counts.get(c)}
    return {"num_labels": n, "accuracy": right / n, "num_right": right,
            "baseline_label": base, "baseline_accuracy": base_n / n, "per_class": per,
            "confusion": confusion}


def session_turns(rows: list[dict], labels_path, prefix, renderer, tokenizer, thinking
                  ) -> dict[Path, tuple[list[HostTurn], list[dict]]]:
    """Each labelled session's host turns and labels, built before any model loads. Raises
    ValueError naming the labels file's line for a session file that does not load or a turn
    it does not have."""
    out: dict[Path, tuple[list[HostTurn], list[dict]]] = {}
    for r in rows:
        if r["session"] not in out:
            try:
                messages, tools = load_session(r["session"])
            except (OSError, ValueError) as e:
                raise ValueError(f"{labels_path}:{r['line']}: {e}") from None
            if prefix:
                messages, tools = with_prefix(messages, prefix)
            out[r["session"]] = (host_turns(messages, tools or None, renderer, tokenizer,
                                            thinking), [])
        turns, labelled = out[r["session"]]
        if r["turn"] >= len(turns):
            raise ValueError(f"{labels_path}:{r['line']}: {r['session'].name} has {len(turns)} "
                             f"turns (0-{len(turns) - 1}), not turn {r['turn']}")
        labelled.append(r)
    return out


def main(argv=None, prog: str | None = None) -> int:
    ap = argparse.ArgumentParser(prog=prog, description="The router's class question at "
                                 "labelled turns against the labels, beside the "
                                 "constant-label baseline.")
    ap.add_argument("labels", help="a JSON-lines file of {session, turn, label}")
    ap.add_argument("--model", help="a Qwen3.5 directory or random:NAME (default: a local "
                    "Qwen3.5-0.8B, else random weights)")
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--grid", type=int, default=512)
    ap.add_argument("--question", help="a question file (default: the 9-class router)")
    ap.add_argument("--prefix", help="an agent's prefix file (../shared/data/prefixes)")
    ap.add_argument("--template", default="qwen3.5-27b", help="the host's chat template")
    ap.add_argument("--template-dir", help="a model directory whose chat template the host "
                    "used")
    ap.add_argument("--no-thinking", action="store_true")
    args = ap.parse_args(argv)
    ReaderConfig(args.grid)                       # bad flags and files fail before the model
    question = load_question(args.question)
    rows = load_labels(args.labels, question)
    prefix = load_prefix(args.prefix) if args.prefix else None
    renderer = Renderer.from_model_dir(args.template_dir, template=args.template)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = args.model or default_model(device)
    tokenizer = load_tokenizer(None if spec.startswith("random:") else spec)
    thinking = False if args.no_thinking else None
    sessions = session_turns(rows, args.labels, prefix, renderer, tokenizer, thinking)
    model = load_model(spec, device=device)
    reader = Reader(model, grid=args.grid, tokenizer=tokenizer)
    print(f"{'session':<28} {'turn':>4}  {'label':<10} {'predicted':<10} {'p':>5}")
    for i, (path, (turns, labelled)) in enumerate(sessions.items()):
        answers = ask_at_turns(reader, f"s{i}", turns, {r["turn"] for r in labelled}, question)
        reader.drop(f"s{i}")                # its pages stay cached for the next
        for r in sorted(labelled, key=lambda r: r["turn"]):
            r["predicted"], r["p"] = answers[r["turn"]]
            print(f"{path.stem[:28]:<28} {r['turn']:>4}  {r['label']:<10} {r['predicted']:<10} "
                  f"{r['p']:>5.2f}", flush=True)
    result = score(rows, question.labels)
    print(f"accuracy {result['accuracy']:.3f} ({result['num_right']}/{result['num_labels']}); "
          f"always {result['baseline_label']!r}: {result['baseline_accuracy']:.3f}",
          file=sys.stderr)
    if model.info.is_random:
        print("random weights: the answers are meaningless (the plumbing is what ran)",
              file=sys.stderr)
    print(json.dumps({**result, "labels_file": str(args.labels), "question": args.question,
                      "prefix": args.prefix, "model": spec,
                      "random_weights": model.info.is_random, "device": device,
                      "grid": args.grid, "dtype": str(model.dtype).removeprefix("torch."),
                      "torch": torch.__version__, "date": str(datetime.date.today())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
