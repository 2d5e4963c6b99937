"""Questions' replies pushed to the door (server.result_box, server.remote.call_pushed): the
reply arrives when the other side pushes it, with no look; a lost push is fetched by a look;
what cannot be pushed says so and is never lost."""
import json
import socket
import threading

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
