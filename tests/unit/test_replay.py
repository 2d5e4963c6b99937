"""Replay of a short multi-turn session through the reader (random:tiny): totals, rollbacks,
and a new user message rolling back to the episode-start checkpoint, not to 0."""
import io
import json

import pytest

from evals.cli import main
from evals.replay import replay_turns
from shadow_plugin.chat.host_view import host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.router import ROUTER, load_question
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader

G = 64
CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 7}  # step {i}" for i in range(30))


def _call(i: int, name: str, args: dict) -> dict:
    """A tool call of an assistant message, as the host's chat format holds it."""
    return {"id": f"c{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def _session():
    call = _call
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
    assert t["num_read"] == reader.committed("s") + t["num_rolled_back"]
    assert t["num_reread"] == sum(reader.stats()["reread_tokens"].values())
    assert t["num_ids"] == len(reader.ids("s"))
    # the new user message drops the first episode's think blocks: one template rewrite
    assert t["rewrites_template"] == 1 and t["rollbacks"] >= 1
    assert 0 < t["num_reread_template"] and \
        t["num_reread_bpe"] + t["num_reread_template"] <= t["num_reread"] <= t["num_rolled_back"]
    assert (t["num_reread_bpe"], t["num_reread_template"]) == \
        tuple(reader.stats()["reread_tokens"][c] for c in ("bpe", "template"))
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
    assert totals["store"]["disk_bytes"] == 0 and totals["store"]["evicted_written"] == {
        "page": 0, "gdn_entry": 0}


def test_cli_replay_with_a_disk_and_a_small_cap(tmp_path, capsys):
    """--disk and --resident-mb reach the reader: what it evicted and wrote is in `store`."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"messages": _session(), "tools": []}))
    assert main(["replay", str(path), "--model", "random:tiny", "--device", "cpu",
                 "--grid", "64", "--check-exact", "--disk", str(tmp_path / "d"),
                 "--resident-mb", "0.2"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    store = first["store"]
    assert first["exact"] is True and store["resident_cap_bytes"] == int(0.2 * 2**20)
    assert store["gdn_entries_evicted"] > 0 and store["spills"] == 1       # the planned stop
    assert store["disk_bytes"] == sum(f.stat().st_size for f in (tmp_path / "d").rglob("*")
                                      if f.is_file())
    evicted = (store["evicted_written"]["gdn_entry"] + store["gdn_entries_not_written"]
               + store["evicted_already_on_disk"]["gdn_entry"])
    assert evicted == store["gdn_entries_evicted"]          # every eviction in one count
    # again on the same folder: the session starts afresh (said), its pages found by key
    assert main(["replay", str(path), "--model", "random:tiny", "--device", "cpu",
                 "--grid", "64", "--check-exact", "--disk", str(tmp_path / "d"),
                 "--resident-mb", "0.2"]) == 0
    out = capsys.readouterr()
    again = json.loads(out.out.strip().splitlines()[-1])
    assert "session s of an earlier run" in out.err and again["exact"] is True
    assert again["rewrites_template"] == first["rewrites_template"]
    assert again["store"]["prefix_cache_hit_tokens"]["disk"] > 0
    for flags, message in ((["--resident-mb", "-1"], "--resident-mb must be a finite number"),
                           (["--resident-mb", "inf"], "--resident-mb must be a finite number"),
                           (["--disk", str(path)], "not a folder")):
        assert main(["replay", str(path), *flags]) == 2
        assert message in capsys.readouterr().err


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


def test_rewrites_are_classified_by_their_text(tiny, tokenizer):
    """A prompt whose new ids spell the held text on (a BPE merge at the boundary) is 'bpe';
    other text is 'template'; an extension is no rewrite; re-read ids are counted under the
    cause."""
    held = tokenizer.encode("The cat sat on the mat, and the dog") + tokenizer.encode(" sa")
    bpe = tokenizer.encode("The cat sat on the mat, and the dog sat down.")
    r = Reader(tiny, grid=G, tokenizer=tokenizer)
    assert r.feed("s", held, "prompt").rewrite is None
    res = r.feed("s", bpe, "prompt")
    assert res.first_difference < len(held) and res.rewrite == "bpe"
    assert r.feed("s", bpe + [11, 12], "prompt").rewrite is None
    assert r.feed("s", tokenizer.encode("A bird flew"), "prompt").rewrite == "template"
    long = list(range(1000, 1000 + 3 * G))
    r.feed("t", long, "prompt")
    r.read("t")
    r.feed("t", long[:10] + [5] * (3 * G), "prompt")        # text differs: template
    r.read("t")
    assert r.stats()["reread_tokens"] == {"bpe": 0, "template": 3 * G, "other": 0}  # below 3G


def test_cli_replays_one_agents_sessions_with_a_prefix(tmp_path, capsys):
    """Two sessions of one agent (the same messages under two names, a prefix file in front):
    one reader, turns interleaved; the second reads less than the first (the prefix's pages
    and state are found), both exact; one JSON line with the hit rate and resident bytes."""
    prefix = tmp_path / "agent.json"
    prefix.write_text(json.dumps({"system": "You are a coding agent. " * 60, "tools": [
        {"type": "function", "function": {"name": "bash", "description": "run a command",
                                          "parameters": {"type": "object", "properties": {
                                              "cmd": {"type": "string"}}}}}]}))
    paths = []
    for name in ("a", "b"):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"messages": _session(), "tools": []}))
    assert main(["replay", *map(str, paths), "--prefix", str(prefix), "--model", "random:tiny",
                 "--device", "cpu", "--grid", "64", "--check-exact"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    a, b = out["sessions"]["a"], out["sessions"]["b"]
    assert a["exact"] is True and b["exact"] is True and a["num_ids"] == b["num_ids"]
    assert b["num_read"] < a["num_read"] and 0 < out["prefix_cache_hit_rate"] < 1
    assert out["resident_bytes"] > 0 and out["pages"]["pinned"] > 0
    assert [x.split(":")[0] for x in lines[:-1]] == ["a", "b"]
    assert a["committed"] % 64 == 0 and a["committed"] <= a["num_ids"]


def test_a_prefix_starts_the_one_system_message():
    from evals.replay import with_prefix
    msgs = [{"role": "system", "content": "own rules"}, {"role": "user", "content": "hi"}]
    out, tools = with_prefix(msgs, ("agent rules", [{"type": "function"}]))
    assert out[0] == {"role": "system", "content": "agent rules\n\nown rules"}
    assert out[1:] == msgs[1:] and tools == [{"type": "function"}]
    out, _ = with_prefix(msgs[1:], ("agent rules", []))
    assert out == [{"role": "system", "content": "agent rules"}, msgs[1]]
