"""Question replies pushed to the door's process when they are ready (server.remote.call_pushed),
from a shadow in another process of the same machine: vLLM's engine process, reached by the
endpoint through vLLM's utility calls. Without it the door learns of an answer at its next look
(`result`), one utility round trip through the engine's loop each, backing off from 1 to 20 ms
while the host has requests. On vLLM's CPU engine the push answered in the time the looks did,
idle and busy (BENCHMARKS.md, "A question's way through vLLM's server"); on a GPU, where the
engine's steps are short beside that back-off, it is not measured yet.

- The door's side, `ResultBox`: a Unix datagram socket in a private folder (mode 0700), bound at
  the first use and read by one daemon thread. `expect()` names a reply by a random key (128
  bits), `reply_to(key)` is what travels with the question, `wait(key, timeout_s)` gives the
  reply when it came, `forget(key)` drops the key.
- The other side, `push(reply_to, reply)`: one datagram {"key", "reply"} as JSON, sent without
  blocking. A reply that cannot be sent (larger than MAX_BYTES, not carried by JSON exactly as
  vLLM's msgpack carries it, the box gone, its queue full) is not lost: it stays with the
  ticket for the door's look; the other side then pushes LOOK (`push(reply_to, LOOK)`) so that
  the door looks at once. `reachable(reply_to)` says whether the box is on this machine at all
  (a data-parallel engine on another node: the door then looks as server.remote.run does).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
import stat
import tempfile
import threading
import weakref

log = logging.getLogger(__name__)
MAX_BYTES = 1 << 18          # a datagram's most bytes (Linux takes ~208 KiB by default; a
#                              larger reply, a long check report say, goes by the look instead)
LOOK = ("look",)             # pushed instead of a reply that could not be: "look now"


class _Slot:
    """One expected reply: set once it came."""

    __slots__ = ("event", "reply")

    def __init__(self):
        self.event = threading.Event()
        self.reply = None


class ResultBox:
    """The door's end. Thread-safe: routes' threads expect and wait, one thread reads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._sock: socket.socket | None = None
        self._path: str | None = None
        self._failed = False                    # binding failed once: never push (looks only)
        # replies that came by a push, and by a look (a push lost or never tried): /metrics
        self.num_replies = {"pushed": 0, "looked": 0}

    def _bind(self) -> bool:
        """Bind the socket and start its reader, once; False when this machine cannot (no
        AF_UNIX): the door then looks for every reply (server.remote.run)."""
        if self._sock is not None or self._failed:
            return self._sock is not None
        folder = sock = None
        try:
            folder = tempfile.mkdtemp(prefix="shadow-box-")     # mode 0700: this user only
            path = os.path.join(folder, "replies")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(path)                   # OSError past 107 bytes (a long TMPDIR)
        except (OSError, AttributeError) as e:
            log.warning("shadow: answers will be looked for, not pushed (%r)", e)
            self._failed = True
            if sock is not None:
                sock.close()
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            return False
        self._sock, self._path = sock, path
        closing = threading.Event()
        weakref.finalize(self, _close, sock, folder, closing)
        threading.Thread(target=_read, args=(sock, weakref.ref(self), closing),
                         name="shadow-box", daemon=True).start()
        return True

    def expect(self) -> str | None:
        """A new key to push a reply to, or None when this box cannot receive (see _bind)."""
        with self._lock:
            if not self._bind():
                return None
            key = secrets.token_hex(16)
            self._slots[key] = _Slot()
            return key

    def reply_to(self, key: str) -> dict:
        """What the other side needs to push the reply of `key` (push's reply_to)."""
        return {"path": self._path, "key": key}

    def wait(self, key: str, timeout_s: float):
        """The reply pushed for `key` (a serve_call reply, lists for tuples; or LOOK, as a
        list), taken (a next wait waits for a next push), or None when none came within
        timeout_s (s). KeyError for a key not expected (or forgotten)."""
        slot = self._slots[key]
        if not slot.event.wait(timeout_s):
            return None
        with self._lock:
            reply, slot.reply = slot.reply, None
            slot.event.clear()
        return reply

    def forget(self, key: str) -> None:
        """Drop `key`: a reply pushed for it later is ignored."""
        with self._lock:
            self._slots.pop(key, None)

    def _deliver(self, key, reply) -> None:
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                slot.reply = reply
                slot.event.set()

    def count(self, path: str) -> None:
        """Count a reply that came by `path` ("pushed" or "looked")."""
        with self._lock:
            self.num_replies[path] += 1

    @property
    def num_expected(self) -> int:
        """Keys expected and not yet forgotten."""
        return len(self._slots)


def _read(sock: socket.socket, box_ref, closing: threading.Event) -> None:
    """The reader thread: each datagram to its slot, until the socket closes."""
    while True:
        try:
            data = sock.recv(MAX_BYTES)
        except OSError:                       # closed with the box
            return
        if not data and closing.is_set():     # shut down with the box (_close)
            return
        box = box_ref()
        if box is None:
            return
        try:
            msg = json.loads(data)
            box._deliver(msg["key"], msg["reply"])
        except (ValueError, KeyError, TypeError) as e:   # not ours: dropped, said once a kind
            log.debug("shadow: a datagram that is not a reply was dropped (%r)", e)
        del box


def _close(sock: socket.socket, folder: str, closing: threading.Event) -> None:
    """The box gone (or the process exiting): its reader woken and ended (a close alone leaves
    a thread blocked in recv on Linux), its socket closed, its folder removed."""
    closing.set()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    shutil.rmtree(folder, ignore_errors=True)


def _exact_in_json(obj) -> bool:
    """Whether JSON carries `obj` as msgpack does (vLLM's utility replies): tuples become lists
    both ways, but a dict key that is not a str would come back a str."""
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _exact_in_json(v) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return all(_exact_in_json(x) for x in obj)
    return True


def reachable(reply_to) -> bool:
    """Whether reply_to names a box on this machine that this process may push to (False for a
    door on another node: its folder is not here)."""
    try:
        path = reply_to["path"]
        return isinstance(path, str) and stat.S_ISSOCK(os.stat(path).st_mode) and \
            os.access(path, os.W_OK)
    except (OSError, TypeError, KeyError, ValueError):
        return False


def push(reply_to, reply) -> bool:
    """Send `reply` (plain data: a serve_call reply) to the box named by reply_to ({"path",
    "key"}, ResultBox.reply_to). True when sent; False when it could not be (reply_to not such
    a dict, the reply not JSON, a dict key in it not a str, over MAX_BYTES, the box gone, its
    queue full): the reply then waits for the door's look. Never blocks, never raises."""
    if not isinstance(reply_to, dict) or not isinstance(reply_to.get("path"), str) \
            or not isinstance(reply_to.get("key"), str):
        return False
    try:
        if not _exact_in_json(reply):
            return False
        data = json.dumps({"key": reply_to["key"], "reply": reply}).encode()
    except (TypeError, ValueError, RecursionError):
        return False
    if len(data) > MAX_BYTES:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(data, reply_to["path"])
        return True
    except OSError as e:                      # gone, full, too large for this kernel
        log.debug("shadow: a reply was not pushed (%r); the door's look will fetch it", e)
        return False
