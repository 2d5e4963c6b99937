"""evals.vllm.moves over a scripted two-rank server (no vLLM: tests/integration/test_vllm.py
runs it on vLLM's CPU engine): the pinned turns' accounting (which turn moved, what a move read
again, what the other rank read) and its summary."""
from types import SimpleNamespace

from evals.vllm import follow, moves
from evals.vllm.agents import AgentScript

G = 64


class TwoRanks:
    """A session's holder and each rank's read_tokens as a shadow would report them: the
    rank serving a turn reads from the line it resumes at (`resume_at(C)`, C the committed
    count before the turn) to the new C (the whole pages of the ids)."""

    def __init__(self, resume_at):
        self.read, self.holder, self.num_ids, self.committed = [0, 0], None, 0, 0
        self.resume_at, self.superseded = resume_at, [0, 0]

    def complete(self, server, prompt, max_tokens, params, headers):
        rank = int(headers["X-data-parallel-rank"])
        out = [7] * max_tokens
        new = (len(prompt) + max_tokens) // G * G
        start = self.committed if self.holder in (None, rank) else self.resume_at(self.committed)
        if self.holder not in (None, rank):
            self.superseded[self.holder] += 1
        self.read[rank] += new - start
        self.holder, self.num_ids, self.committed = rank, len(prompt) + max_tokens, new
        return out, {}

    def status(self, server):
        sessions = {} if self.holder is None else {"agent": {
            "rank": self.holder, "num_ids": self.num_ids, "committed": self.committed}}
        return {"sessions": sessions,
                "ranks": [{"read_tokens": n, "superseded": s}
                          for n, s in zip(self.read, self.superseded)]}


def _run(monkeypatch, resume_at):
    ranks = TwoRanks(resume_at)
    monkeypatch.setattr(moves, "complete", ranks.complete)
    monkeypatch.setattr(moves, "shadow_status", ranks.status)
    monkeypatch.setattr(moves, "check", lambda server, s, ids: {"ok": len(ids) == ranks.num_ids})
    script = AgentScript("agent", tuple(range(1000, 1150)),
                         tuple(tuple(range(2000, 2100)) for _ in range(3)))
    return moves.pinned_turns(SimpleNamespace(), script, [0, 1, 1, 0], 24, G, 5)


def test_a_move_that_resumes_at_the_other_ranks_line_reads_nothing_again(monkeypatch):
    rows = _run(monkeypatch, lambda c: c)
    assert [r["moved"] for r in rows] == [False, True, False, True]
    assert [r["reread_tokens"] for r in rows] == [0, 0, 0, 0]
    assert all(r["read_tokens"][1 - r["rank"]] == 0 for r in rows)
    assert [r["committed"] for r in rows] == [128, 256, 384, 512]
    assert rows[-1]["superseded"] == [1, 1]
    assert moves.summarize_pinned(rows, G) == {
        "turns": 4, "moves": 2, "all_exact": True, "max_reread_tokens": 0,
        "reread_within_a_page": True, "others_read_nothing": True}


def test_a_move_that_resumes_two_pages_back_is_over_the_bound(monkeypatch):
    rows = _run(monkeypatch, lambda c: max(0, c - 2 * G))
    assert [r["reread_tokens"] for r in rows] == [0, 2 * G, 0, 2 * G]
    summary = moves.summarize_pinned(rows, G)
    assert summary["max_reread_tokens"] == 2 * G and not summary["reread_within_a_page"]


def test_balanced_waits_for_whichever_rank_holds_each_session(monkeypatch):
    """The balanced part: a session not yet in the status, then held by rank 1 after its
    last turn moved there, is waited for on the rank that holds it, then checked; the copies
    given up and the ids read beyond the sessions' growth are the counters' differences."""
    polls = iter(range(100))

    def status(server):
        n = next(polls)
        if n == 0:                                     # before the agents
            return {"sessions": {}, "read_tokens": 0,
                    "ranks": [{"superseded": 0, "write_errors": 0}] * 2}
        if n < 3:                                      # not yet there, then a busy server
            if n == 2:
                raise KeyError("sessions")
            return {"sessions": {}, "read_tokens": 0, "ranks": []}
        return {"sessions": {"a": {"rank": 1, "ranks": [0, 1], "num_ids": 300,
                                   "committed": 256}},
                "read_tokens": 320, "ranks": [{"superseded": 1, "write_errors": 0},
                                              {"superseded": 0, "write_errors": 0}]}

    def run_agent(server, script, num_tokens, held, errors, max_turns=None):
        held[script.name] = [1] * 300
    monkeypatch.setattr(moves, "shadow_status", status)
    monkeypatch.setattr(follow, "run_agent", run_agent)      # what run_agents threads run
    monkeypatch.setattr(moves, "check", lambda server, s, ids: {"ok": len(ids) == 300})
    out = moves.balanced(SimpleNamespace(), [AgentScript("a", (1,), ())], 8, G, 5)
    assert out["agents"]["a"]["rank"] == 1 and out["agents"]["a"]["check"] == {"ok": True}
    assert out["copies_given_up"] == 1 and out["committed_growth"] == 256
    assert out["reread_tokens"] == 320 - 256 and out["all_exact"]
