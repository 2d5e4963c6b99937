"""Issue 34: a check of a session's committed state read a chunk at a time (Reader.begin_check,
advance_check, finish_check; the service lets its lock go between two chunks) gives what one
fresh prefill gave, bit for bit, and compares the session as it was when it began, whatever
happens to the session between two chunks: never a false "not exact"; a real difference is
still found."""
import threading

import pytest
import torch
from helpers import check_refs, rand_ids  # noqa: E402

from block_store import ExactnessError
from shadow_plugin import Reader
from shadow_plugin.reader import exact

G = 64


def test_a_fresh_prefill_in_steps_with_other_reads_between_gives_one_loops_bits(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("other", rand_ids(6 * G, 2), "prompt")
    ids = rand_ids(5 * G, 1)
    want = exact.fresh_prefill(reader.adapter, ids)
    fp = exact.begin_fresh(reader.adapter, ids)
    num_steps = 0
    while exact.fresh_step(reader.adapter, fp):
        num_steps += 1
        reader.read("other", max_chunks=1)         # the same adapter, between two chunks
    got = exact.fresh_state(reader.adapter, fp)
    assert num_steps == 4 and reader.committed("other") == 4 * G
    assert list(got) == list(want)
    for name, w in want.items():
        assert torch.equal(got[name].view(torch.uint8), w.view(torch.uint8)), name


def test_a_check_in_chunks_is_check_exact(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(5 * G + 17), "prompt")
    reader.read("s")
    pinned = reader.stats()["pages"]["pinned"]
    chk = reader.begin_check("s")
    assert (chk.num_ids, chk.committed) == (5 * G + 17, 5 * G)
    assert reader.stats()["pages"]["pinned"] == pinned          # the session's own, shared
    steps = [reader.advance_check(chk) for _ in range(5)]
    assert steps == [True, True, True, True, False]
    assert reader.finish_check(chk) is True
    reader.cancel_check(chk)                                     # again: nothing more
    check_refs(reader)
    assert reader.check_exact("s") is True


@pytest.mark.parametrize("change", ["rewrite", "read", "drop", "spill"])
def test_a_check_compares_the_session_as_it_began(tiny, tmp_path, change):
    """Between two chunks the session is rewritten below C, read further, dropped, or parked
    to disk (its pages given back by the session): the check still compares its snapshot."""
    reader = Reader(tiny, grid=G, disk_dir=tmp_path)
    ids = rand_ids(6 * G + 9)
    reader.feed("s", ids, "prompt")
    reader.read("s", max_chunks=4)
    chk = reader.begin_check("s")
    assert reader.advance_check(chk)
    if change == "rewrite":
        reader.feed("s", ids[:2 * G + 3] + rand_ids(3 * G, 5), "prompt")
        reader.read("s")
        assert reader.committed("s") == 5 * G and reader.check_exact("s")
    elif change == "read":
        reader.read("s")
        assert reader.committed("s") == 6 * G
    elif change == "drop":
        reader.drop("s")
    else:
        reader.table.park("s")
        reader.table.forget_memory()
    while reader.advance_check(chk):
        pass
    assert reader.finish_check(chk) is True and chk.committed == 4 * G
    check_refs(reader)


def test_a_check_in_chunks_still_finds_a_difference(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(3 * G + 5), "prompt")
    reader.read("s")
    conv, rec = reader._get("s").gdn[0]
    rec.view(-1)[7] += 1.0                        # the session's states at C damaged
    chk = reader.begin_check("s")
    while reader.advance_check(chk):
        pass
    with pytest.raises(ExactnessError, match="recurrent"):
        reader.finish_check(chk)
    check_refs(reader)


def test_the_services_check_reports_the_session_as_it_began_and_that_it_moved(tmp_path):
    """Through the facade (a chunk per hold of the lock): a host's output to the session
    between two chunks is reported as `moved`, the report is of the session as it began, and
    a client that leaves stops the check with nothing held."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    from shadow_plugin.server.app import create_app
    from shadow_plugin.server.config import ServiceConfig
    from shadow_plugin.server.errors import ClientGone
    from shadow_plugin.server.facade import ids_digest

    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=0.02))
    prompt = rand_ids(4 * G + 5, 3)
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        while c.get("/healthz").json()["state"] != "ready":
            pass
        c.post("/v1/shadow/sessions/s/turn", json={"prompt_ids": prompt})
        c.post("/v1/shadow/sessions/s/end")
        assert c.post("/v1/shadow/ask", json={"session": "s", "question": "q", "wait": True,
                                              "choices": ["a", "b"]}).status_code == 200
        shadow = c.app.state.service.shadow
        pinned = shadow.stats()["pages"]["pinned"]
        steps, real = [], shadow._let_waiters_in

        def between(*args, **kwargs):            # no lock held here: a host's call comes in
            if not steps:
                shadow.output("s", [1200, 1201])
            steps.append(1)
            real(*args, **kwargs)

        shadow._let_waiters_in = between
        report = shadow.check("s")
        assert len(steps) == 4                   # one let-in before each of the 4 chunks
        assert report == {"session": "s", "num_ids": 4 * G + 5, "committed": 4 * G,
                          "exact": True, "error": None, "ids_xxh3": ids_digest(prompt),
                          "moved": True}
        cancelled, steps[:] = threading.Event(), []

        def leave(*args, **kwargs):
            steps.append(1)
            if len(steps) == 2:
                cancelled.set()
        shadow._let_waiters_in = leave
        with pytest.raises(ClientGone):
            shadow.check("s", cancelled)
        shadow._let_waiters_in = real
        assert shadow.stats()["pages"]["pinned"] == pinned
        again = c.get("/v1/shadow/sessions/s/check").json()
        assert (again["num_ids"], again["exact"], again["moved"]) == (4 * G + 7, True, False)


def test_moved_sees_ids_rewritten_to_the_same_length_and_read_back_to_the_same_c(tmp_path):
    """Review: between two of the check's chunks the host rewrites the session with other ids
    of the same length (a changed byte in an old turn) and the reader reads it back to the
    same C: the session changed, so `moved` says so (comparing (ids held, C) alone said
    False)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    from shadow_plugin.server.app import create_app
    from shadow_plugin.server.config import ServiceConfig

    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G, state_dir=tmp_path,
                        scheduler=SchedulerConfig(grid=G, poll_s=3600, idle_at_finish=False))
    prompt = rand_ids(4 * G + 5, 3)
    rewrite = prompt[:G + 7] + [(prompt[G + 7] + 1) % 1000] + prompt[G + 8:]
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        while c.get("/healthz").json()["state"] != "ready":
            pass
        shadow = c.app.state.service.shadow
        shadow.turn("s", prompt, None, None)
        shadow.end("s")
        with shadow.lock:
            shadow.reader.read("s")
        real, steps = shadow._let_waiters_in, []

        def between(*args, **kwargs):            # no lock held here: a host's call comes in
            if not steps:
                shadow.turn("s", rewrite, None, None)
                shadow.end("s")
                with shadow.lock:
                    assert shadow.reader.committed("s") < 4 * G
                    shadow.reader.read("s")
                    assert shadow.reader.position("s") == (4 * G + 5, 4 * G)
            steps.append(1)
            real(*args, **kwargs)

        shadow._let_waiters_in = between
        report = shadow.check("s")
        shadow._let_waiters_in = real
        assert (report["num_ids"], report["committed"], report["exact"]) == (4 * G + 5, 4 * G,
                                                                             True)
        assert report["moved"] is True
