"""Agents for the vLLM trial (evals/vllm/trial.py): recorded sessions turned into what a client
sends a host turn by turn when the history it keeps holds the host's own outputs.

A recorded session gives, per assistant turn k, the prompt P_k its host served and the
output O_k it produced (shadow_plugin.chat.host_view). An agent replayed against another host sends
P_0 first; then, with that host's output H_k,

    Q_{k+1} = Q_k + H_k + [<|im_end|> unless H_k ends with it] + S_k

where S_k is what the recording put after assistant message k before turn k+1's generation
prompt (the tool results or user message, rendered): the ids of P_{k+1} after the
<|im_end|> that closes message k, found by counting the <|im_end|>s of P_k + O_k. So each
prompt extends the last prompt and output, as a host's prefix cache and the shadow both see
it. A re-rendered history (a client that sends its stored transcript again: another rendering
of the same conversation) is the recorded P_r sent at turn r in place of Q_r; the turns after
it continue from there.

Built on a CPU with the tokenizer (`python -m evals.vllm.agents`), stored as one .npz, so the
device needs no tokenizer for the agents.

    S=../shared/data/sessions
    python -m evals.vllm.agents -o .devdata/agents.npz \\
        long=$S/claudecode_vsla_5f8cbb78.json+$S/claudecode_vsla_9034225e_seg2.json \\
        f67=$S/claudecode_vsla_f67ab274_seg3.json@12 ...
(evals/device/vllm_stage.sh pack writes the trial's agents this way.)
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shadow_plugin.chat.tokenizer import CHAT_TOKENS

IM_END = CHAT_TOKENS.im_end


@dataclass(frozen=True)
class AgentScript:
    """name: the session's name (shadow_session); first_prompt: P_0; suffixes: S_k for
    k = 0 .. num_turns-2 (S_k follows turn k's output); rerender_turn: the turn r that sends
    the recorded P_r (rerender_prompt) in place of Q_r, or None."""

    name: str
    first_prompt: tuple[int, ...]
    suffixes: tuple[tuple[int, ...], ...]
    rerender_turn: int | None = None
    rerender_prompt: tuple[int, ...] = ()

    @property
    def num_turns(self) -> int:
        return len(self.suffixes) + 1


def closing_index(ids, num_closed: int) -> int:
    """Index of the num_closed-th <|im_end|> in `ids` (1-based count). ValueError when `ids`
    holds fewer."""
    seen = 0
    for i, t in enumerate(ids):
        if t == IM_END:
            seen += 1
            if seen == num_closed:
                return i
    raise ValueError(f"{num_closed} closing <|im_end|> wanted, {seen} found")


def suffix_after(prompt, output, next_prompt) -> list[int]:
    """S_k (module doc): the ids of next_prompt after the <|im_end|> that closes the message
    `prompt + output` ends with. ValueError when next_prompt has too few messages."""
    num_closed = sum(1 for t in prompt if t == IM_END) + sum(1 for t in output if t == IM_END)
    return list(next_prompt[closing_index(next_prompt, num_closed) + 1:])


def next_prompt(prompt, output, suffix) -> list[int]:
    """Q_{k+1} = Q_k + H_k + [<|im_end|> unless H_k ends with it] + S_k."""
    close = [] if output and output[-1] == IM_END else [IM_END]
    return list(prompt) + list(output) + close + list(suffix)


def script_from_turns(name: str, turns, rerender_turn: int | None = None) -> AgentScript:
    """An AgentScript from a recording's host turns (shadow_plugin.chat.host_view.HostTurn:
    prompt_ids, output_ids). ValueError for a rerender_turn outside 1 .. len(turns)-1."""
    if rerender_turn is not None and not 1 <= rerender_turn < len(turns):
        raise ValueError(f"{name}: rerender turn {rerender_turn} outside 1..{len(turns) - 1}")
    suffixes = tuple(tuple(suffix_after(a.prompt_ids, a.output_ids, b.prompt_ids))
                     for a, b in zip(turns, turns[1:]))
    rerender = () if rerender_turn is None else tuple(turns[rerender_turn].prompt_ids)
    return AgentScript(name, tuple(turns[0].prompt_ids), suffixes, rerender_turn, rerender)


def prompts(script: AgentScript, outputs) -> list[list[int]]:
    """The prompts the agent sends given the host's outputs (one per turn so far): Q_0 .. Q_n
    for n = len(outputs), capped at the script's turns. The trial builds them one at a time
    with next_prompt; this is the same rule for tests."""
    out = [list(script.first_prompt)]
    for k, h in enumerate(outputs[:script.num_turns - 1]):
        out.append(list(script.rerender_prompt) if k + 1 == script.rerender_turn
                   else next_prompt(out[-1], h, script.suffixes[k]))
    return out


def save(scripts: list[AgentScript], path: Path) -> None:
    """One .npz: per script NAME, NAME/first, NAME/suffixes (concatenated) and
    NAME/suffix_lens, NAME/rerender ([turn] + P_r, or empty); `names` in order."""
    arrays = {"names": np.asarray([s.name for s in scripts])}
    for s in scripts:
        arrays[f"{s.name}/first"] = np.asarray(s.first_prompt, np.int32)
        arrays[f"{s.name}/suffixes"] = np.asarray([t for x in s.suffixes for t in x], np.int32)
        arrays[f"{s.name}/suffix_lens"] = np.asarray([len(x) for x in s.suffixes], np.int64)
        arrays[f"{s.name}/rerender"] = np.asarray(
            [] if s.rerender_turn is None else [s.rerender_turn, *s.rerender_prompt], np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def load(path: Path) -> list[AgentScript]:
    """The scripts `save` wrote, in order."""
    with np.load(path) as z:
        scripts = []
        for name in z["names"].tolist():
            flat, lens = z[f"{name}/suffixes"].tolist(), z[f"{name}/suffix_lens"].tolist()
            bounds = np.cumsum([0] + lens).tolist()
            suffixes = tuple(tuple(flat[a:b]) for a, b in zip(bounds, bounds[1:]))
            rr = z[f"{name}/rerender"].tolist()
            scripts.append(AgentScript(name, tuple(z[f"{name}/first"].tolist()), suffixes,
                                       rr[0] if rr else None, tuple(rr[1:])))
    return scripts


def _messages(paths: list[Path]) -> tuple[list[dict], list | None]:
    """The sessions' messages one after another (a later file's system message dropped: one
    long session), and the first file's tools."""
    messages, tools = [], None
    for i, path in enumerate(paths):
        raw = json.loads(path.read_text())
        part = raw["messages"]
        if i:
            part = [m for m in part if m.get("role") != "system"]
        else:
            tools = raw.get("tools") or None
        messages += part
    return messages, tools


def _parse(spec: str) -> tuple[str, list[Path], int | None]:
    """NAME=FILE[+FILE...][@TURN]"""
    name, _, rest = spec.partition("=")
    files, _, turn = rest.partition("@")
    if not name or not files:
        raise ValueError(f"{spec!r}: expected NAME=FILE[+FILE...][@RERENDER_TURN]")
    return name, [Path(f) for f in files.split("+")], int(turn) if turn else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("agents", nargs="+", help="NAME=FILE[+FILE...][@TURN]: a session (several "
                    "files: one after another), re-rendered at TURN")
    ap.add_argument("-o", "--out", type=Path, default=Path(".devdata/agents.npz"))
    ap.add_argument("--template", default="qwen3.5-27b")
    args = ap.parse_args(argv)
    from shadow_plugin.chat.host_view import host_turns
    from shadow_plugin.chat.renderer import Renderer
    from shadow_plugin.chat.tokenizer import load_tokenizer
    renderer, tokenizer = Renderer.from_model_dir(None, template=args.template), load_tokenizer()
    scripts = []
    for spec in args.agents:
        name, files, turn = _parse(spec)
        messages, tools = _messages(files)
        script = script_from_turns(name, host_turns(messages, tools, renderer, tokenizer), turn)
        scripts.append(script)
        total = len(script.first_prompt) + sum(map(len, script.suffixes))
        print(f"{name}: {script.num_turns} turns, first prompt {len(script.first_prompt)} ids, "
              f"{total} ids besides the host's outputs, re-rendered at {turn}")
    save(scripts, args.out)
    print(args.out)


if __name__ == "__main__":
    main()
