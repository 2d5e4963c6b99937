"""A door over several engines' shadows on one folder (server.ranks), as vLLM's data-parallel
ranks have them: which rank holds a session, the merged status and metrics, and the question
routes over two embedded shadows (shadow_plugin.engine.embedded, each fed its own engine's
request events) sharing one disk folder, an agent's turns moving between them: exact on the
rank that took each turn, a move reading again at most one page, the routes reaching the
rank that holds the session."""
import time

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers import rand_ids  # noqa: E402

from shadow_plugin.engine.embedded import EmbeddedShadow, StepInfo
from shadow_plugin.engine.follow import RequestTracker
from shadow_plugin.scheduling.scheduler import SchedulerConfig
from shadow_plugin.server.ask_pool import AskPool
from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.errors import NotReady
from shadow_plugin.server.ranks import (
    RankedService,
    holder,
    merge_metrics,
    merge_sessions,
    merge_status,
)
from shadow_plugin.server.routes import question_router

G = 64


def test_the_holder_is_the_newest_version_then_resident_then_more_ids_then_the_lowest_rank():
    def h(version, resident=False, num_ids=100):
        return {"num_ids": num_ids, "committed": 64, "resident": resident, "version": version}
    assert holder([None, None]) is None
    assert holder([h(3, resident=True), h(4)]) == 1            # rank 1 wrote the newer one
    assert holder([h(4), h(4, resident=True)]) == 1            # the same: the one in memory
    assert holder([h(4, True, 90), h(4, True, 120)]) == 1      # then more ids
    assert holder([h(4, True), h(4, True)]) == 0               # then the lowest rank
    assert holder([h(None, True), None, h(1)]) == 2            # never written: below any
    assert holder([None, h(None)]) == 1


def _status(rank_sessions, read_tokens, disk_bytes=1000, writer="w0"):
    return {"state": "ready", "grid": G, "model": "m", "read_tokens": read_tokens,
            "restores": 1, "restore_ms": 2.5, "server": {"writer": writer},
            "totals": {"num_chunks": read_tokens // G, "read_ms": 1.5,
                       "read_max_ms": 1.0 + read_tokens / 64,
                       "read_max_host_part_ms": 0.5 + read_tokens / 256,
                       "read_max_gc_ms": 2.0 - read_tokens / 128,
                       "read_max_forward_ms": read_tokens / 512,
                       "read_max_num_chunks": read_tokens // 64,
                       "read_max_cpu_ms": 0.75 - read_tokens / 1024,
                       "read_max_num_chunks_before": read_tokens // 128},
            "pages": {"pinned": 2, "cached": 1, "free": 5, "disk": 7},
            "disk_bytes": disk_bytes, "open_turns": ["x"] if read_tokens else [],
            "sessions": rank_sessions,
            "question_ms": {"buckets": [[10, 1], [float("inf"), 2]], "sum": 30.0}}


def _entry(residency, version, num_ids=200, committed=192):
    return {"residency": residency, "version": version, "num_ids": num_ids,
            "committed": committed, "backlog": num_ids - committed}


def test_the_merged_status_sums_counters_counts_the_folder_once_and_merges_sessions():
    a = _status({"s": _entry("resident", 3), "only0": _entry("disk", 1)}, 128)
    b = _status({"s": _entry("resident", 4, 260, 256)}, 64, disk_bytes=1200, writer="w1")
    out = merge_status([("ok", a), ("ok", b)])
    assert (out["restores"], out["restore_ms"]) == (2, 5.0)
    assert [r["server"]["writer"] for r in out["ranks"]] == ["w0", "w1"]   # each rank named
    assert out["state"] == "ready" and out["error"] is None and out["num_ranks"] == 2
    assert out["read_tokens"] == 192      # a longest one is the ranks' longest, not a sum
    # the longest read's parts come with it, from its rank (a: 3.0 ms, its 1.0 ms host part,
    # 1.0 ms of collections, 0.25 ms in forwards, 2 chunks; b's belong to a shorter read)
    assert out["totals"] == {"num_chunks": 3, "read_ms": 3.0, "read_max_ms": 3.0,
                             "read_max_host_part_ms": 1.0, "read_max_gc_ms": 1.0,
                             "read_max_forward_ms": 0.25, "read_max_num_chunks": 2,
                             "read_max_cpu_ms": 0.625, "read_max_num_chunks_before": 1}
    # a longest read from a rank that lacks a part (an older version): that part left out,
    # not taken from the other rank's shorter read
    del a["totals"]["read_max_cpu_ms"]
    mixed = merge_status([("ok", a), ("ok", b)])["totals"]
    assert mixed["read_max_ms"] == 3.0 and "read_max_cpu_ms" not in mixed
    assert out["pages"] == {"pinned": 4, "cached": 2, "free": 10, "disk": 7}   # disk: once
    assert out["disk_bytes"] == 1200 and out["open_turns"] == ["x", "x"]
    assert out["sessions"]["s"]["rank"] == 1 and out["sessions"]["s"]["num_ids"] == 260
    assert out["sessions"]["s"]["ranks"] == [0, 1] and out["sessions"]["only0"]["rank"] == 0
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    assert out["ranks"][0]["sessions_resident"] == ["s"] and "sessions" not in out["ranks"][0]
    assert out["ranks"][1]["read_tokens"] == 64 and a["pages"]["disk"] == 7   # a unchanged
    metrics = merge_metrics([("ok", a), ("error", "NotReady", ("loading", False)), ("ok", b)])
    assert metrics["question_ms"] == {"buckets": [[10, 2], [float("inf"), 4]], "sum": 60.0}
    assert merge_metrics([("error", "NotReady", ("x", False))]) is None


def test_a_manifest_every_rank_refused_is_one_refusal_in_the_merged_status():
    bad = {"session": "s", "file": "s.json", "reason": "damaged: checksum"}
    other = {"session": "t", "file": "t.json", "reason": "foreign: identity"}
    a = {**_status({}, 0), "refusals": 2, "refusal_reasons": {"damaged": 1, "set_aside": 1},
         "refused_sessions": [bad]}
    b = {**_status({}, 0), "refusals": 2, "refusal_reasons": {"damaged": 1, "foreign": 1},
         "refused_sessions": [dict(bad), other]}
    out = merge_status([("ok", a), ("ok", b)])
    assert out["refused_sessions"] == [bad, other]
    assert out["refusals"] == 3
    assert out["refusal_reasons"] == {"damaged": 1, "set_aside": 1, "foreign": 1}


def test_a_rank_that_is_not_ready_makes_the_merged_state_say_so_with_its_reason():
    a = _status({}, 0)
    loading = merge_status([("ok", a), ("error", "NotReady", ("the model is loading", False))])
    assert loading["state"] == "loading" and "sessions" not in loading
    assert loading["error"] == "rank 1: the model is loading"
    failed = merge_status([("error", "NotReady", ("bad model", True)), ("ok", a)])
    assert failed["state"] == "failed" and failed["ranks"][0]["state"] == "failed"
    assert merge_sessions([{}, {}]) == {}


def test_a_rank_that_is_not_ready_leaves_the_sessions_other_ranks_hold_answerable():
    """RankedService over two ranks, rank 1 still loading: a session rank 0 holds is looked up
    and its calls go to rank 0 (the grid from rank 0's status); a session no ready rank
    knows is NotReady (503: it may be held on rank 1), not KeyError (404); with both
    ready, an unknown session is KeyError."""
    loading = ("error", "NotReady", ("the model is loading", False))
    state = {"rank1": loading}
    entry = {"num_ids": 200, "committed": 192, "resident": True, "version": 3}
    calls = []

    def reply(rank, name, kwargs):
        if rank == 1:
            return state["rank1"]
        if name == "status":
            return ("ok", {"state": "ready", "grid": G})
        if name == "holds":
            return ("ok", {s: entry for s in kwargs["sessions"] if s == "held"})
        calls.append((rank, name))
        return ("ok", {"got": name})

    door = RankedService(reply, lambda name, kw: [reply(r, name, kw) for r in range(2)],
                         lambda: 2)
    shadow = door.require()
    assert shadow.rank_of("held") == 0 and shadow.grid == G
    assert shadow.positions(["held"]) == {"held": [200, 192]}
    assert shadow.narration("held") == {"got": "narration"} and calls == [(0, "narration")]
    with pytest.raises(NotReady, match="loading"):
        shadow.rank_of("elsewhere")
    state["rank1"] = ("ok", {})
    with pytest.raises(KeyError):
        door.require().rank_of("elsewhere")


def _two_ranks(rank1_reply):
    """A door over two ranks: rank 0 ready, holding "held" (and listing it), rank 1
    answering every call with rank1_reply."""
    entry = {"num_ids": 200, "committed": 192, "resident": True, "version": 3}

    def reply(rank, name, kwargs):
        if rank == 1:
            return rank1_reply
        if name == "status":
            return ("ok", {"state": "ready", "grid": G})
        if name == "holds":
            return ("ok", {s: entry if s == "held" else None for s in kwargs["sessions"]})
        if name == "sessions":
            return ("ok", {"sessions": {"held": _entry("resident", 3)}})
        return ("ok", {"got": name})

    return RankedService(reply, lambda name, kw: [reply(r, name, kw) for r in range(2)],
                         lambda: 2)


def test_a_rank_that_failed_for_good_knows_nothing_and_an_unknown_session_is_404():
    """A rank whose shadow failed to load holds no session, ever (it follows nothing): a
    session the ready ranks do not know is KeyError (404), not a 503 for good; positions
    says None for it, and the sessions list is the ready ranks'. A rank still loading
    keeps the 503 (it may hold the session once up)."""
    failed = _two_ranks(("error", "NotReady", ("the model failed to load: bad; fix", True)))
    shadow = failed.require()
    assert shadow.rank_of("held") == 0
    with pytest.raises(KeyError):
        shadow.rank_of("elsewhere")
    assert shadow.positions(["held", "elsewhere"]) == {"held": [200, 192], "elsewhere": None}
    assert list(shadow.sessions()["sessions"]) == ["held"]
    loading = _two_ranks(("error", "NotReady", ("the model is loading", False))).require()
    with pytest.raises(NotReady, match="loading"):
        loading.rank_of("elsewhere")
    with pytest.raises(NotReady, match="loading"):
        loading.sessions()
    gone = ("error", "NotReady", ("the model failed to load: bad; fix", True))
    none = RankedService(lambda rank, name, kw: gone, lambda name, kw: [gone, gone],
                         lambda: 2).require()             # no rank ready: the failure, 503
    for call in (lambda: none.rank_of("held"), none.sessions,
                 lambda: none.positions(["held"])):
        with pytest.raises(NotReady, match="failed to load") as e:
            call()
        assert e.value.failed


def test_a_wait_on_a_session_held_by_a_ready_rank_ends_when_read_whatever_others_wait_on():
    """Waits over the DP door with rank 1 loading: one poll looks at every waited session in
    one positions call, and a session no ready rank knows makes that call NotReady; the wait
    on a session rank 0 holds (C at its line) still ends, only the other gets the 503."""
    import asyncio

    from shadow_plugin.server.waits import Waits
    door = _two_ranks(("error", "NotReady", ("the model is loading", False)))

    async def run():
        waits = Waits(door, poll_s=0.01)
        held = asyncio.create_task(waits.wait("held", 192, 2.0))
        other = asyncio.create_task(waits.wait("elsewhere", None, 2.0))
        got = await asyncio.gather(held, other, return_exceptions=True)
        assert got[0] is None, got
        assert isinstance(got[1], NotReady), got
    asyncio.run(run())


@pytest.fixture
def ranks(tmp_path):
    """Two embedded shadows on one shared folder: an engine's two data-parallel ranks."""
    embs = []
    for rank in range(2):
        cfg = ServiceConfig(model="random:tiny", device="cpu", grid=G,
                            state_dir=tmp_path / f"state{rank}", disk_dir=tmp_path / "disk",
                            disk_shared=True,
                            scheduler=SchedulerConfig(grid=G, poll_s=0.02, share=0.3))
        emb = EmbeddedShadow(cfg)
        emb.start()
        embs.append(emb)
    assert [e.service.wait_loaded(60) for e in embs] == ["ready", "ready"]
    yield embs
    for emb in embs:
        emb.close()


def _step(emb, events, running, has_requests):
    info = StepInfo(tuple(events), tuple(running), has_requests)
    emb.begin_step(info)
    emb.step_slot(info)
    emb.end_step(info)
    assert emb.wait_applied(30)


def _serve(emb, tracker, rid, session, prompt, output):
    """One request on one engine: its prompt, its outputs, its end, each in a step (the idle
    window reads what is left)."""
    tracker.start(rid, prompt, session)
    _step(emb, tracker.take(), (rid,), True)
    tracker.progress(rid, output)
    _step(emb, tracker.take(), (rid,), True)
    tracker.finish(rid, output)
    _step(emb, tracker.take(), (), False)


def _caught_up(emb, session, num_ids):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        n, c = emb.service.shadow.position(session)
        if n == num_ids and c >= num_ids // G * G:
            return c
        time.sleep(0.02)
    raise AssertionError(f"{session} not read up to {num_ids // G * G}")


def test_turns_moving_between_two_ranks_stay_exact_and_the_routes_find_the_holder(ranks):
    calls = {"holds": 0}

    def call(rank, name, kwargs):
        calls["holds"] += name == "holds"
        return ranks[rank].call(name, kwargs)

    door = RankedService(call, lambda name, kwargs: [call(r, name, kwargs) for r in (0, 1)],
                         lambda: 2)
    app = FastAPI()
    app.include_router(question_router(door, AskPool(2, 4)))
    trackers = [RequestTracker(), RequestTracker()]
    ids: list[int] = []
    committed_before = 0
    with TestClient(app) as c:
        for turn, rank in enumerate((0, 1, 0, 1)):
            prompt = ids + rand_ids(G + 37 * turn + 11, 10 + turn)
            output = rand_ids(29, 50 + turn)
            read_before = [e.service.reader.stats()["read_tokens"] for e in ranks]
            _serve(ranks[rank], trackers[rank], f"r{turn}", "agent", prompt, output)
            ids = prompt + output
            committed = _caught_up(ranks[rank], "agent", len(ids))
            check = c.get("/v1/shadow/sessions/agent/check").json()
            assert check["exact"] is True and check["rank"] == rank, check
            assert check["num_ids"] == len(ids) and check["committed"] == committed
            num_read = ranks[rank].service.reader.stats()["read_tokens"] - read_before[rank]
            # what the other rank committed was on the folder: at most one page read again
            assert committed - committed_before <= num_read <= committed - committed_before + G
            other = 1 - rank
            assert ranks[other].service.reader.stats()["read_tokens"] == read_before[other]
            status = c.get("/v1/shadow/status").json()
            assert status["num_ranks"] == 2 and status["state"] == "ready"
            entry = status["sessions"]["agent"]
            assert entry["rank"] == rank and entry["num_ids"] == len(ids), entry
            assert status["read_tokens"] == sum(r["read_tokens"] for r in status["ranks"])
            if turn:
                assert entry["ranks"] == [0, 1]
            committed_before = committed
        # a question goes to the holder (rank 1), found by one lookup on each rank: the same
        # answer as its own reader's
        holds_before = calls["holds"]
        r = c.post("/v1/shadow/ask", json={"session": "agent", "question": "Code?",
                                           "choices": ["yes", "no"]})
        assert r.status_code == 200, r.text
        assert calls["holds"] - holds_before == 2
        local = ranks[1].service.shadow.reader.ask("agent", "Code?", ["yes", "no"])
        assert r.json()["probs"] == list(local.probs)
        r = c.post("/v1/shadow/ask", json={"session": "agent", "question": "Code?",
                                           "choices": ["yes", "no"], "wait": True,
                                           "timeout_s": 30})
        assert r.status_code == 200 and r.json()["probs"] == list(local.probs), r.text
        assert c.post("/v1/shadow/ask", json={"session": "nobody", "question": "q",
                                              "choices": ["a", "b"]}).status_code == 404
        assert c.get("/v1/shadow/sessions/nobody/check").status_code == 404
        listed = c.get("/v1/shadow/sessions").json()["sessions"]
        assert listed["agent"]["rank"] == 1
    # each rank's copy that another rank's turn superseded was given up for the folder's
    stats = [e.service.reader.stats() for e in ranks]
    assert [s["superseded"] for s in stats] == [1, 1] and [s["write_errors"] for s in stats] \
        == [0, 0]


def test_a_question_on_the_server_that_did_not_take_the_last_turn_reads_the_newest_ids(ranks):
    """Two servers on one shared folder, no door between them: the agent's last turn went to
    rank 1; a question asked on rank 0 (which still holds the older copy in memory) forks at
    the newest ids and answers as rank 1 does."""
    trackers = [RequestTracker(), RequestTracker()]
    first = rand_ids(2 * G + 5, 1)
    _serve(ranks[0], trackers[0], "a", "agent", first, rand_ids(9, 2))
    ids = first + rand_ids(9, 2)
    _caught_up(ranks[0], "agent", len(ids))
    prompt = ids + rand_ids(G + 3, 3)
    _serve(ranks[1], trackers[1], "b", "agent", prompt, rand_ids(7, 4))
    ids = prompt + rand_ids(7, 4)
    _caught_up(ranks[1], "agent", len(ids))
    assert ranks[0].service.shadow.position("agent")[0] < len(ids)     # the older copy
    stale = ranks[0].service.shadow
    assert stale.fork_position("agent", None) == len(ids)
    assert stale.position("agent")[0] == len(ids)
    mine = stale.reader.ask("agent", "Code?", ["yes", "no"])
    theirs = ranks[1].service.shadow.reader.ask("agent", "Code?", ["yes", "no"])
    assert mine.probs == theirs.probs
