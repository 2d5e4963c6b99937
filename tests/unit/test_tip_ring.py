"""Issue 33: the tip ring holds the GDN states at the last checkpoints.TIP_LINES lines a
session's C stood at (every chunk committed, within one read too), so a change just below C
resumes within a page of it, also after a planned stop and restart; a question's reads take
nothing from it; what a session gives up goes at once, so one session's GDN entries stay within
its ring and its checkpoints."""
import random

from helpers import rand_ids

from block_store.checkpoints import TIP_LINES
from block_store.memory.gdn_table import GdnTable
from shadow_plugin.reader.reader import Reader

G = 512


def _rewrite(reader, sid, d, n, rng):
    """Feed a prompt equal to the held ids below d, then n new ids; read it all. Returns
    (the feed's result, ids read)."""
    res = reader.feed(sid, reader.ids(sid)[:d] + rand_ids(n - d, rng), "prompt")
    return res, reader.read(sid).num_read_tokens


def test_the_ring_reaches_three_pages_below_c():
    """The named cases need the line three pages below C (C 2,048, change at 1,500)."""
    assert TIP_LINES >= 3


def test_a_change_below_c_within_one_read_resumes_a_page_below_it(tiny):
    """The issue's case: 2,200 ids read in one call (C 2,048), the next prompt changes at
    1,500: it resumes at 1,024 (line 1,024 was committed in that read) and reads 2,048 - 1,024
    ids below the old C plus the new tail, not 2,048 from 0."""
    rng = random.Random(1)
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(2200, rng), "prompt")
    assert reader.read("s").num_read_tokens == 2048
    res, num_read = _rewrite(reader, "s", 1500, 2200, rng)
    assert (res.first_difference, res.rolled_back_from, res.rolled_back_to) == (1500, 2048, 1024)
    assert num_read == 1024
    assert sum(reader.stats()["reread_tokens"].values()) == 1024
    assert reader.check_exact("s")


def test_a_change_below_c_after_a_planned_stop_resumes_a_page_below_it(tiny, tmp_path):
    """The issue's second case: a 2,560-id session read whole, a planned stop, a new reader on
    the same folder; a prompt changing at 1,700 (3,072 ids) resumes at 1,536 from the tip
    entries written at the stop and reads 1,536 ids, not 3,072 from 0."""
    rng = random.Random(2)
    first = Reader(tiny, grid=G, disk_dir=tmp_path)
    ids = rand_ids(2560, rng)
    first.feed("s", ids, "prompt")
    first.read("s")
    first.close()
    again = Reader(tiny, grid=G, disk_dir=tmp_path)
    res = again.feed("s", ids[:1700] + rand_ids(3072 - 1700, rng), "prompt")
    assert (res.first_difference, res.rolled_back_to) == (1700, 1536)
    assert again.committed("s") == 1536
    assert again.read("s").num_read_tokens == 3072 - 1536
    assert again.check_exact("s")


def test_questions_between_turns_leave_the_ring_and_resume_within_a_page(tiny):
    """A question at the end of the ids commits the backlog's whole chunks (the output too);
    the next prompt differing a few ids above the previous prompt's end (a BPE merge at the
    boundary) resumes at the line at or below the change, under a GDN budget of 0 bytes, and
    the ring is the last TIP_LINES lines committed."""
    rng = random.Random(3)
    reader = Reader(tiny, grid=G, gdn_bytes=0)
    prompt = rand_ids(1300, rng)
    for _ in range(4):
        res = reader.feed("s", prompt, "prompt")
        if res.first_difference is not None and res.first_difference < (res.rolled_back_from or 0):
            assert res.rolled_back_to == res.first_difference // G * G
        reader.read("s")
        reader.feed("s", rand_ids(1100, rng), "output")
        reader.ask("s", [1, 2, 3], ["a", "b"])              # commits the output's chunks
        c = reader.committed("s")
        st = reader.table.resident["s"]
        assert [e.line for e in st.tip] == [x for x in range(c - (TIP_LINES - 1) * G, c + 1, G)
                                            if x > 0][-TIP_LINES:]
        held = reader.ids("s")
        d = len(prompt) - 1                                   # the prompt's last id changes
        prompt = held[:d] + rand_ids(len(held) - d + 300, rng)
    assert reader.check_exact("s")


def test_one_session_holds_at_most_its_ring_and_checkpoints(tiny):
    """Many turns of one session: the GDN entries held are the ring's and the checkpoints'
    (at most TIP_LINES + max_checkpoints + 2); tips rotated out unused and checkpoints past the
    cap go at once, counted under their kind."""
    rng = random.Random(4)
    reader = Reader(tiny, grid=64, max_checkpoints=2)
    ids = rand_ids(100, rng)
    for _ in range(12):
        reader.feed("s", ids, "prompt")
        reader.read("s")
        reader.feed("s", rand_ids(90, rng), "output")
        ids = reader.ids("s") + rand_ids(80, rng)
    stats = reader.stats()
    assert stats["gdn_entries"]["resident"] <= TIP_LINES + 2 + 2
    evictions = stats["gdn_entry_evictions"]
    assert evictions["tip"] > 0 and evictions["checkpoint"] > 0
    assert reader.check_exact("s")


def test_a_fork_below_c_takes_no_tip(tiny):
    """A question below C re-reads in a scratch base: the session's ring is unchanged and the
    scratch leaves no entry behind."""
    rng = random.Random(5)
    reader = Reader(tiny, grid=64, max_checkpoints=1)
    reader.feed("s", rand_ids(700, rng), "prompt")
    reader.read("s")
    st = reader.table.resident["s"]
    ring, held = list(st.tip), set(reader.table.store.gdn.entries)
    reader.ask("s", [1, 2, 3], ["a", "b"], at=130)
    assert st.tip == ring and set(reader.table.store.gdn.entries) <= held


def test_eviction_goes_by_rank_then_least_recently_used():
    """Loose entries past the budget: never-used checkpoints first, then states at C and
    entries that served a resume, junctions last."""
    import torch
    t = GdnTable(budget_bytes=0)
    states = [(torch.zeros(2), torch.zeros(2))]
    made = {k: t.put(k.encode(), 64, states, kind) for k, kind in
            [("j", "junction"), ("s", "state"), ("c", "checkpoint"), ("h", "checkpoint")]}
    made["h"].hits = 1
    order = []
    t.on_evict = lambda e: order.append(e.key.decode())
    for e in made.values():
        t.release(e)
    t.evict(2 * made["j"].nbytes)
    assert order == ["c", "s"]
    t.evict(0)
    assert order == ["c", "s", "h", "j"]
    assert t.evicted_by_kind["checkpoint"] == 2 and t.evicted_by_kind["junction"] == 1
