"""Crash consistency at the reader (issue 19): a second reader on the folder stands for a
restart after `kill -9` (the first never closes). A session holds what its last manifest
held: all its ids after a turn's start or end, or, when outputs came after it, a prefix marked
stale until the host's next prompt; outputs to a stale session are refused; a manifest the
disk refused makes the feed say so; a manifest damaged while no reader ran is listed with its
reason until the session is dropped or started again."""
import random

import pytest
from helpers import disk_reader, rand_ids  # noqa: E402

from shadow_plugin.reader.conflicts import StaleSession
from shadow_plugin.reader.reader import Reader

G = 64


def test_outputs_after_the_turn_come_back_stale_until_the_next_prompt(tiny, tmp_path):
    rng = random.Random(0)
    a = disk_reader(tiny, tmp_path, G)
    prompt, out = rand_ids(3 * G + 10, rng), rand_ids(20, rng)
    assert a.feed("s", prompt, "prompt").durable is True
    a.read("s")
    a.feed("s", out[:5], "output")
    a.feed("s", out[5:], "output")               # one stale-marking write a turn
    b = disk_reader(tiny, tmp_path, G)                   # the restart: `a` died without a word
    assert b.position("s")[0] == len(prompt) and b.stale("s")
    assert b.stats()["sessions"]["s"]["stale"] is True
    with pytest.raises(StaleSession, match="holding 202 ids"):
        b.feed("s", [7], "output")
    assert b.ids("s") == prompt                   # nothing appended, nothing lost
    ans = b.ask("s", "Code?", ["yes", "no"])
    assert ans.stale and ans.at == len(prompt)
    assert b.generate("s", "Summarize.", 2).stale            # every answer says so
    nxt = prompt + out + rand_ids(30, rng)           # the host's next prompt re-synchronises
    assert b.feed("s", nxt, "prompt").durable is True and not b.stale("s")
    b.read("s")
    assert b.check_exact("s")
    assert not b.ask("s", "Code?", ["yes", "no"]).stale
    c = disk_reader(tiny, tmp_path, G)
    assert c.ids("s") == nxt and not c.stale("s")


def test_a_turns_end_holds_every_id_and_a_park_keeps_the_mark(tiny, tmp_path):
    rng = random.Random(1)
    a = disk_reader(tiny, tmp_path, G)
    prompt, out = rand_ids(2 * G, rng), rand_ids(9, rng)
    a.feed("s", prompt, "prompt")
    a.feed("s", out, "output")
    assert a.save("s") is True                    # the turn's end
    assert not disk_reader(tiny, tmp_path, G).stale("s")
    assert disk_reader(tiny, tmp_path, G).ids("s") == prompt + out
    more = rand_ids(4, rng)
    a.feed("s", more, "output")                   # after the end: marked stale again
    b = disk_reader(tiny, tmp_path, G)
    assert b.stale("s") and b.ids("s") == prompt + out
    b.close()                                     # a planned stop parks it: still stale
    c = disk_reader(tiny, tmp_path, G)
    assert c.stale("s") and c.ids("s") == prompt + out


def test_a_refused_manifest_write_is_reported_and_outputs_wait(tiny, tmp_path, monkeypatch):
    a = disk_reader(tiny, tmp_path, G)
    disk = a.table.store.disk

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(disk, "write_manifest", full)
    res = a.feed("s", list(range(1000, 1000 + G + 3)), "prompt")
    assert res.durable is False and a.stats()["write_errors"] == 1
    assert a.mark_outputs("s") is False and a.stats()["write_errors"] == 2
    assert disk_reader(tiny, tmp_path / "none", G).feed("x", [5, 6], "prompt").durable is True
    no_disk = Reader(tiny, grid=G)
    assert no_disk.feed("x", [5, 6], "prompt").durable is None
    assert no_disk.mark_outputs("x") is None


def test_a_manifest_damaged_while_down_is_listed_until_dropped(tiny, tmp_path):
    rng = random.Random(2)
    a = disk_reader(tiny, tmp_path, G)
    for sid in ("bad", "gone", "good"):
        a.feed(sid, rand_ids(G + 5, rng), "prompt")
    for sid in ("bad", "gone"):
        path = a.table.store.disk.manifest_path(sid)
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0xFF                           # a flipped byte in the ids
        path.write_bytes(bytes(raw))
    b = disk_reader(tiny, tmp_path, G)
    listed = {r["session"]: r for r in b.stats()["refused_sessions"]}
    assert set(listed) == {"bad", "gone"} and "checksum" in listed["bad"]["reason"]
    s = b.stats()                              # issue 34: 0 while 2 were listed
    assert (s["refusals"], s["refusal_reasons"]) == (2, {"checksum": 2})
    assert b.position("good")[0] == G + 5
    with pytest.raises(KeyError, match="refused at start-up"):
        b.position("bad")                         # touched: counted once, still listed
    assert b.refused("bad") is not None and b.stats()["refusals"] == 2
    b.table.store.disk.manifest_path("gone").unlink()     # the TTL took it: still listed
    s = b.stats()
    assert s["refusals"] == len(s["refused_sessions"]) == 2
    b.drop("bad")                                 # DELETE: no longer listed
    assert {r["session"] for r in b.stats()["refused_sessions"]} == {"gone"}
    assert b.stats()["refusals"] == 2          # a count since start: it never goes down
    b.feed("gone", [1, 2, 3], "prompt")           # started again: no longer listed
    assert b.stats()["refused_sessions"] == [] and b.ids("gone") == [1, 2, 3]
    assert b.stats()["refusals"] == 2
