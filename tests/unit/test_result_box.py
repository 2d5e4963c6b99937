"""Questions' replies pushed to the door (server.result_box, server.remote.call_pushed): the
reply arrives when the other side pushes it, with no look; a lost push is fetched by a look;
what cannot be pushed says so and is never lost."""
import concurrent.futures
import gc
import json
import math
import os
import socket
import tempfile
import threading
import time

import pytest

from shadow_plugin.server import remote
from shadow_plugin.server.result_box import MAX_BYTES, ResultBox, push


def test_a_pushed_reply_reaches_the_key_that_expects_it_exactly():
    box = ResultBox()
    a, b = box.expect(), box.expect()
    assert a != b and len(a) == 32
    reply = ["ok", {"probs": [0.1, 1 / 3, 2e-300], "label": "x\u00e9", "n": 7}]
    assert push(box.reply_to(b), reply) is True
    assert box.wait(b, 5) == reply                  # floats exactly (JSON keeps repr)
    assert box.wait(a, 0.01) is None                # nothing for the other key
    box.forget(a)
    box.forget(b)
    assert box.num_expected == 0
    with pytest.raises(KeyError):
        box.wait(a, 0.01)


def test_a_reply_for_a_forgotten_key_or_a_stray_datagram_is_dropped():
    box = ResultBox()
    key = box.expect()
    to = box.reply_to(key)
    box.forget(key)
    assert push(to, ["ok", 1]) is True              # sent, and ignored there
    other = box.expect()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(b"not json", to["path"])
        s.sendto(json.dumps({"nokey": 1}).encode(), to["path"])
    assert push(box.reply_to(other), ["ok", 2]) and box.wait(other, 5) == ["ok", 2]


def test_what_cannot_be_pushed_says_so_and_never_raises(tmp_path):
    box = ResultBox()
    key = box.expect()
    to = box.reply_to(key)
    assert push(to, ["ok", "x" * MAX_BYTES]) is False        # too large: left for a look
    assert push(to, ["ok", object()]) is False                # not JSON
    assert push({"path": str(tmp_path / "gone"), "key": key}, ["ok", 1]) is False
    assert push(None, ["ok", 1]) is False
    assert push({"path": 3, "key": key}, ["ok", 1]) is False
    assert box.wait(key, 0.05) is None


class FakeWorker:
    """The other side of call_pushed: answers a ticketed call with a ticket, then pushes the
    reply from a thread after `delay_s` (or not at all), and answers looks."""

    def __init__(self, reply, push_it=True, delay_s=0.01, done_after_looks=0):
        self.reply, self.push_it, self.delay_s = reply, push_it, delay_s
        self.done_after_looks = done_after_looks
        self.calls = []

    def __call__(self, name, kwargs):
        self.calls.append((name, dict(kwargs)))
        if name == "result":
            looks = sum(n == "result" for n, _ in self.calls)
            return self.reply if looks > self.done_after_looks else ("pending", False)
        if name not in remote.TICKETED:
            return ("ok", "light")
        if self.push_it:
            to = kwargs["reply_to"]
            threading.Timer(self.delay_s, push, (to, list(self.reply))).start()
        return ("ticket", 5)


def test_call_pushed_returns_the_pushed_reply_without_a_look():
    box, worker = ResultBox(), FakeWorker(("ok", {"a": 1}))
    got = remote.call_pushed(worker, box, "ask", {"session": "s"}, look_every_s=5)
    assert got == ["ok", {"a": 1}]
    assert [n for n, _ in worker.calls] == ["ask"]            # no look
    sent = worker.calls[0][1]
    assert sent["session"] == "s" and set(sent["reply_to"]) == {"path", "key"}
    assert box.num_expected == 0                              # the key forgotten
    assert box.num_replies == {"pushed": 1, "looked": 0}
    assert remote.unpack(got) == {"a": 1}


def test_call_pushed_fetches_a_lost_push_by_a_look():
    box, worker = ResultBox(), FakeWorker(("ok", 3), push_it=False, done_after_looks=2)
    assert remote.call_pushed(worker, box, "check", {}, look_every_s=0.01) == ("ok", 3)
    looks = [kw for n, kw in worker.calls if n == "result"]
    assert looks == [{"ticket": 5, "wait_s": 0}] * 3 and box.num_expected == 0
    assert box.num_replies == {"pushed": 0, "looked": 1}


def test_call_pushed_leaves_light_calls_errors_and_a_box_less_door_as_they_are():
    box = ResultBox()
    worker = FakeWorker(("ok", 1))
    assert remote.call_pushed(worker, box, "status", {}) == ("ok", "light")
    assert "reply_to" not in worker.calls[0][1]
    refused = remote.call_pushed(lambda n, kw: ("error", "KeyError", ("no session",)), box,
                                 "ask", {})
    assert refused == ("error", "KeyError", ("no session",)) and box.num_expected == 0
    box_less = FakeWorker(("ok", 1), push_it=False)
    assert remote.call_pushed(box_less, None, "ask", {}) == ("ticket", 5)   # run's to look for
    assert "reply_to" not in box_less.calls[0][1]


def test_a_lost_reply_is_fetched_at_once_when_the_other_side_pushes_look():
    """A reply that could not be pushed (too large, a question that failed): the worker pushes
    LOOK and the door looks at once, not after look_every_s."""
    from shadow_plugin.server.result_box import LOOK

    class LookWorker(FakeWorker):
        def __call__(self, name, kwargs):
            reply = super().__call__(name, kwargs)
            if name in remote.TICKETED:
                threading.Timer(0.01, push, (kwargs["reply_to"], LOOK)).start()
            return reply
    box, worker = ResultBox(), LookWorker(("ok", "big"), push_it=False)
    t0 = time.perf_counter()
    assert remote.call_pushed(worker, box, "check", {}, look_every_s=30) == ("ok", "big")
    assert time.perf_counter() - t0 < 5
    assert [n for n, _ in worker.calls] == ["check", "result"] and box.num_expected == 0


def test_a_ticket_the_other_side_cannot_push_is_looked_for_as_run_does():
    """("ticket", n, False): the box is not on the worker's machine (a data-parallel engine on
    another node); the door looks at once, waiting on the other side, not look_every_s."""
    looks = []

    def worker(name, kwargs):
        if name == "result":
            looks.append(kwargs)
            return ("ok", 9) if len(looks) == 3 else ("pending", True)
        return ("ticket", 4, False)
    t0 = time.perf_counter()
    assert remote.call_pushed(worker, ResultBox(), "ask", {}, look_every_s=30) == ("ok", 9)
    assert time.perf_counter() - t0 < 5
    assert looks == [{"ticket": 4, "wait_s": remote.RESULT_WAIT_S}] * 3


def test_a_wait_takes_the_reply_and_a_reply_json_would_change_is_not_pushed():
    box = ResultBox()
    key = box.expect()
    to = box.reply_to(key)
    assert push(to, ["ok", {1: "a"}]) is False          # an int key would come back "1"
    assert push(to, ["ok", [{"x": {2.5: 1}}]]) is False
    special = ["ok", {"p": [float("inf"), -0.0, 5e-324], "t": (1, 2)}]
    assert push(to, special) is True
    got = box.wait(key, 5)
    assert got == ["ok", {"p": [float("inf"), -0.0, 5e-324], "t": [1, 2]}]
    assert str(got[1]["p"][1]) == "-0.0"
    assert box.wait(key, 0.01) is None                   # taken: the next wait waits anew
    nan = box.expect()
    assert push(box.reply_to(nan), ["ok", float("nan")]) is True
    assert math.isnan(box.wait(nan, 5)[1])


def test_reachable_names_only_a_box_on_this_machine(tmp_path):
    from shadow_plugin.server.result_box import reachable
    box = ResultBox()
    to = box.reply_to(box.expect())
    assert reachable(to) is True
    (tmp_path / "file").write_text("x")
    assert not reachable({"path": str(tmp_path / "file"), "key": "k"})   # not a socket
    assert not reachable({"path": str(tmp_path / "gone"), "key": "k"})
    assert not reachable(None) and not reachable({"path": 3}) and not reachable({})


def test_a_box_that_goes_away_ends_its_reader_and_removes_its_folder():
    def readers() -> set:                 # other tests' boxes may still be ending theirs
        return {t for t in threading.enumerate() if t.name == "shadow-box"}
    before = readers()
    boxes = [ResultBox() for _ in range(5)]
    folders = [os.path.dirname(b.reply_to(b.expect())["path"]) for b in boxes]
    assert all(os.path.isdir(f) and os.stat(f).st_mode & 0o777 == 0o700 for f in folders)
    ours = readers() - before
    assert len(ours) == 5
    del boxes
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in ours) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in ours)
    assert not any(os.path.exists(f) for f in folders)


def test_a_box_that_cannot_bind_leaves_no_folder_and_the_door_looks(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 120)                        # past AF_UNIX's 107 bytes
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    box = ResultBox()
    assert box.expect() is None and box.expect() is None
    assert list(deep.iterdir()) == []
    box_less = FakeWorker(("ok", 1), push_it=False)
    assert remote.call_pushed(box_less, box, "ask", {}) == ("ticket", 5)
    assert "reply_to" not in box_less.calls[0][1]


class _Refusing:
    """A service stand-in whose facade is not up, or whose question raises."""

    def __init__(self, error):
        self.error = error

    def require(self):
        raise self.error


def _embedded(tmp_path, error):
    from shadow_plugin.engine.embedded import EmbeddedShadow
    from shadow_plugin.server.config import ServiceConfig
    emb = EmbeddedShadow(ServiceConfig(model="random:tiny", device="cpu",
                                       state_dir=tmp_path / "state"))
    emb.service = _Refusing(error)                      # never started: no model
    return emb


def test_an_embedded_shadow_pushes_a_reply_or_look_and_says_when_it_cannot_push(tmp_path):
    from shadow_plugin.server.errors import NotReady
    from shadow_plugin.server.result_box import LOOK
    emb = _embedded(tmp_path, NotReady("loading", False))
    box = ResultBox()
    key = box.expect()
    ticket = emb._submit("ask", {"session": "s"}, box.reply_to(key))
    assert ticket[0] == "ticket" and ticket[2] is True
    assert box.wait(key, 5) == ["error", "NotReady", ["loading", False]]
    far = emb._submit("ask", {}, {"path": str(tmp_path / "other-node"), "key": key})
    assert far[2] is False                               # looked for, as run does
    concurrent.futures.wait([emb._jobs[far[1]]], timeout=5)
    assert emb._result(far[1]) == ("error", "NotReady", ("loading", False))
    emb.service = _Refusing(RuntimeError("a bug"))      # not one of the packed errors
    key = box.expect()
    ticket = emb._submit("check", {"session": "s"}, box.reply_to(key))
    assert box.wait(key, 5) == list(LOOK)
    with pytest.raises(RuntimeError, match="a bug"):    # the look raises it, as before
        emb._result(ticket[1])
    emb._questions.shutdown()
