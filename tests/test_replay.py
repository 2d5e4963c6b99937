"""Replay of a short multi-turn session through the reader (random:tiny): totals, rollbacks,
and a new user message rolling back to the episode-start checkpoint, not to 0."""
import io
import json

import pytest

from evals.cli import main
from evals.replay import replay_turns
from shadow_plugin.host_view import host_turns
from shadow_plugin.reader import Reader
from shadow_plugin.renderer import Renderer
from shadow_plugin.router import ROUTER, load_question
from shadow_plugin.tokenizer import load_tokenizer

G = 64
CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 7}  # step {i}" for i in range(30))


def _session():
    call = lambda i, name, args: {"id": f"c{i}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(args)}}
    msgs = [{"role": "system", "content": "You are a coding agent. Use the tools. " * 20},
            {"role": "user", "content": "The function f3 returns the wrong value; fix it."}]
    for i in range(4):
        msgs += [{"role": "assistant", "content": "", "reasoning_content": f"Step {i}: look at "
                  f"the file again and check the constants {i} times.",
                  "tool_calls": [call(i, "read_file", {"path": f"src/mod{i}.py"})]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": CODE[: 400 + 150 * i]}]
    msgs += [{"role": "assistant", "content": "Fixed f3.", "reasoning_content": "All done."},
             {"role": "user", "content": "Thanks. Now add a test for f3."},
             {"role": "assistant", "content": "", "reasoning_content": "Write the test.",
              "tool_calls": [call(9, "edit_file", {"path": "tests/test_mod.py"})]},
             {"role": "tool", "tool_call_id": "c9", "content": "1 passed in 0.01s"},
             {"role": "assistant", "content": "Added the test."}]
    return msgs


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_replay_totals_and_episode_rollback(tiny, tokenizer):
    turns = host_turns(_session(), None, Renderer.from_model_dir(None), tokenizer)
    assert len(turns) == 7
    reader = Reader(tiny, grid=G, tokenizer=tokenizer)
    out = io.StringIO()
    totals = replay_turns(reader, "s", turns, ROUTER, tokenizer, check_exact=True, out=out)
    t = totals.as_dict()
    assert t["exact"] is True and t["turns"] == 7
    assert t["num_read"] == reader.committed("s") + t["num_reread"]
    assert t["num_ids"] == len(reader.ids("s"))
    # the new user message drops the first episode's think blocks: one template rewrite
    assert t["rewrites_template"] == 1 and t["rollbacks"] >= 1
    assert len(out.getvalue().splitlines()) == 8            # header + a row a turn
    # replay again up to the new user message, then check where that rollback lands
    r2 = Reader(tiny, grid=G, tokenizer=tokenizer)
    replay_turns(r2, "s", turns[:5], ROUTER, tokenizer, out=None)
    episode_start = turns[0].prompt_ids
    line = (len(episode_start) - 5) // G * G        # the generation prompt is 5 ids
    assert line in r2.checkpoint_positions("s")
    res = r2.feed("s", turns[5].prompt_ids, "prompt")
    assert res.episode_start and res.rolled_back_to == line > 0


def test_question_file(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"question": "Code?", "choices": ["yes", "no"]}))
    q = load_question(path)
    assert q.labels == ("yes", "no")
    path.write_text(json.dumps({"question": "Code?", "choices": ["yes"]}))
    with pytest.raises(ValueError, match="2 to 26"):
        load_question(path)


def test_cli_replay(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"messages": _session(), "tools": []}))
    assert main(["replay", str(path), "--model", "random:tiny", "--device", "cpu",
                 "--grid", "64", "--check-exact"]) == 0
    totals = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert totals["exact"] is True and totals["turns"] == 7


@pytest.mark.parametrize("content,message", [
    ("[]", "expected an object with a 'messages' list"),
    ("x", "not a JSON file"),
    ('{"messages": [1]}', "messages[0] must be an object"),
    ('{"messages": [], "tools": 3}', "'tools' must be a list"),
])
def test_cli_errors(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["replay", str(path), "--model", "random:tiny", "--device", "cpu"]) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_flags_fail_before_loading(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--model", "random:tiny"]) == 2      # a directory
    assert main(["replay", "missing.json", "--grid", "100"]) == 2
    broken = tmp_path / "tdir"
    broken.mkdir()
    (broken / "chat_template.jinja").write_text("{% for %}")
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"messages": _session()}))
    assert main(["replay", str(path), "--template-dir", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "Is a directory" in err and "multiple of 64" in err and "chat template" in err
