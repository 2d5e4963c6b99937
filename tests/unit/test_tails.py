"""Questions' tails (shadow_plugin.reader.tails): a fork forwards ids[line:cut] on its own
(Adapter.read_rows), then the rest from cut; the reader keeps the tail, and a question found on
a kept tail gives the bits it gets without one, the bits a fresh reader gives, and those of the
forwards done by hand through the adapter. Grid 256: tails of 64, 128 and 192 ids (fork.tail_cut:
a quarter of a grid or more; a shorter one goes with the question)."""
import pytest
import torch
from helpers import check_refs, fork_logits, logits_by_hand, rand_ids

from adapters import ROW_ALIGN
from block_store import contiguous_kv
from block_store.memory.layout import zero_gdn
from block_store.memory.pool import PoolFull
from shadow_plugin import Reader
from shadow_plugin.reader import fork

G = 256
LETTERS = [1000 + i for i in range(4)]


def _fresh(tiny, ids, **kw) -> Reader:
    reader = Reader(tiny, grid=G, **kw)
    reader.feed("s", ids, "prompt")
    reader.read("s")
    return reader


def _by_hand(tiny, ids: list[int], q_ids: list[int]) -> list[float]:
    """The letters' probabilities of a question after `ids`, forwarded by hand through the
    adapter of a reader that keeps no tail (helpers.logits_by_hand)."""
    adapter = Reader(tiny, grid=G, max_tails=0).adapter
    return torch.softmax(logits_by_hand(adapter, ids, q_ids, LETTERS), dim=-1).tolist()


def _ask(reader: Reader, q_ids, at=None):
    return reader.ask("s", q_ids, list("abcd"), at)


@pytest.mark.parametrize("n", [3 * G + 128, 3 * G + 200, 3 * G + 255, 3 * G + 100, 3 * G + 64,
                               3 * G + 63, 3 * G + 30, 100, 200])
def test_a_kept_tail_gives_the_bits_of_none_of_a_fresh_reader_and_of_the_forwards(tiny, n):
    ids, q_ids = rand_ids(n), rand_ids(40, 1)
    kept = _fresh(tiny, ids)
    first = _ask(kept, q_ids)
    cut, line = fork.tail_cut(n, G), n // G * G
    assert cut == (n // ROW_ALIGN * ROW_ALIGN if n - line >= G // 4 else line)
    assert kept.tails.num_made == (1 if cut > line else 0)
    second = _ask(kept, q_ids)                             # on the kept tail
    assert kept.tails.num_hits == (1 if cut > line else 0)
    none = _ask(_fresh(tiny, ids, max_tails=0), q_ids)
    # the letters' ids are the tokenizer's: compare those through the letters given
    assert first.probs == second.probs == none.probs
    assert second.num_forwarded_tokens == n - cut + len(q_ids)
    assert first.num_forwarded_tokens == n - line + len(q_ids)
    got = fork_logits(kept, "s", q_ids, LETTERS, kept.tails)[0]
    got = torch.softmax(got, dim=-1).tolist()
    assert got == _by_hand(tiny, ids, q_ids)
    check_refs(kept)
    assert kept.check_exact("s")


def test_a_tail_is_found_by_content_and_lost_with_a_rewrite_below_its_cut(tiny):
    ids, q_ids = rand_ids(2 * G + 150), rand_ids(30, 1)
    reader = _fresh(tiny, ids)
    reader.feed("t", ids, "prompt")                        # the same ids: its pages, its tail
    reader.read("t")
    a = _ask(reader, q_ids)
    b = reader.ask("t", q_ids, list("abcd"))
    assert a.probs == b.probs and reader.tails.num_hits == 1
    changed = ids[:2 * G + 70] + [ids[2 * G + 70] + 1] + ids[2 * G + 71:]   # below the cut
    reader.feed("s", changed, "prompt")
    reader.read("s")
    c = _ask(reader, q_ids)
    assert reader.tails.num_hits == 1 and reader.tails.num_made == 2
    assert c.probs == _ask(_fresh(tiny, changed, max_tails=0), q_ids).probs
    check_refs(reader)


def test_questions_at_once_below_c_and_decoding_give_their_bits_alone(tiny):
    ids = rand_ids(4 * G + 10)
    reader = _fresh(tiny, ids)
    at = 2 * G + 180                                       # below C: a scratch base
    items = [(rand_ids(20 + 7 * i, i), list("abcd")) for i in range(3)]
    many = reader.ask_many("s", items, at)
    alone = _fresh(tiny, ids, max_tails=0)
    for (q, ch), got in zip(items, many):
        assert got.probs == alone.ask("s", q, ch, at).probs
    assert reader.tails.num_made == 1 and reader.tails.num_hits == 0   # one tail for all
    prompt = rand_ids(12, 5)
    gen = reader.generate("s", prompt, max_new_tokens=6, at=at)
    assert reader.tails.num_hits == 1
    assert gen.ids == alone.generate("s", prompt, max_new_tokens=6, at=at).ids
    check_refs(reader)
    assert reader.check_exact("s")


def test_a_long_question_reads_from_its_cut_to_the_grid_line_then_chunks(tiny):
    ids = rand_ids(G + 130)
    q_ids = rand_ids(2 * G + 40, 3)                        # cut, a piece to the line, a chunk
    reader = _fresh(tiny, ids)
    pending = reader.begin_ask("s", q_ids, list("abcd"))
    steps = 0
    while reader.advance(pending):
        steps += 1
    assert steps == 2
    ans = reader.finish_ask(pending)
    assert ans.probs == _ask(_fresh(tiny, ids, max_tails=0), q_ids).probs
    got = fork_logits(reader, "s", q_ids, LETTERS, reader.tails)[0]
    got = torch.softmax(got, dim=-1).tolist()
    assert got == _by_hand(tiny, ids, q_ids)
    check_refs(reader)


def test_the_least_recently_used_tail_goes_and_its_page_with_it(tiny):
    reader = Reader(tiny, grid=G, max_tails=2)
    for i, sid in enumerate("abc"):
        reader.feed(sid, rand_ids(G + 150, 10 + i), "prompt")
        reader.read(sid)
        reader.ask(sid, rand_ids(10, 1), ["y", "n"])
    assert len(reader.tails) == 2 and reader.tails.num_evicted == 1
    st = reader.stats()
    assert st["tails_held"] == 2 and st["tails_made"] == 3
    gdn_bytes = sum(c.nbytes + r.nbytes for c, r in reader._get("a").gdn)
    assert st["tail_bytes"] == 2 * (reader.store.pool.page_bytes + gdn_bytes)
    check_refs(reader)
    reader.close()
    assert len(reader.tails) == 0


def test_a_sessions_newer_tip_tail_replaces_its_older_one_and_a_tail_below_c_does_not(tiny):
    """Each turn leaves the session's older tail behind its line: the idle window's make_tail
    (and a question at the end) replaces the session's tip tail instead of keeping both until
    max_tails; a question below C keeps its tail beside it, and another session's tip stays."""
    ids = rand_ids(5 * G + 150)
    reader = Reader(tiny, grid=G, max_tails=8)
    reader.feed("o", rand_ids(G + 200, 9), "prompt")
    reader.read("o")
    assert reader.make_tail("o")
    for n in (G + 150, 2 * G + 150, 3 * G + 200):
        reader.feed("s", ids[:n], "prompt")
        reader.read("s")
        assert reader.make_tail("s")
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (4, 2, 2)
    assert st["tails_evicted"] == 0
    q = rand_ids(10, 1)
    below = reader.ask("s", q, ["y", "n"], at=2 * G + 170)       # below C: kept beside it
    tip = reader.ask("s", q, ["y", "n"])                          # on the kept tip tail
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"], st["tail_hits"]) == \
        (5, 2, 3, 1)
    alone = _fresh(tiny, ids[:3 * G + 200], max_tails=0)
    assert tip.probs == alone.ask("s", q, ["y", "n"]).probs
    assert below.probs == alone.ask("s", q, ["y", "n"], at=2 * G + 170).probs
    reader.feed("s", ids, "prompt")                               # a question at the new end
    reader.read("s")
    reader.ask("s", q, ["y", "n"])
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (6, 3, 3)
    check_refs(reader)
    reader.close()
    assert len(reader.tails) == 0 and reader.tails._tips == {}


def test_a_tip_tail_two_sessions_share_stays_until_both_have_left_it(tiny):
    """Sessions with the same ids have one tail at their end (by content): the idle window's
    make_tail or a question at the end finds it held and makes it that session's tip too, so
    one session's newer tail does not give up the tail the other is still at (it would be
    forwarded again), and the last session to leave it does."""
    ids, q = rand_ids(3 * G + 150), rand_ids(10, 1)
    n1, n2 = G + 150, 2 * G + 150
    reader = Reader(tiny, grid=G)
    for sid in "abc":
        reader.feed(sid, ids[:n1], "prompt")
        reader.read(sid)
    assert reader.make_tail("a") is True
    assert reader.make_tail("b") is False                 # held: b's tip too
    reader.ask("c", q, ["y", "n"])                         # found at c's end: c's tip too
    reader.feed("a", ids[:n2], "prompt")
    reader.read("a")
    assert reader.make_tail("a") is True
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (2, 0, 2)
    alone = _fresh(tiny, ids[:n1], max_tails=0)
    for sid in "bc":                                       # on the kept tail, not made again
        got = reader.ask(sid, q, ["y", "n"])
        assert got.num_forwarded_tokens == n1 - fork.tail_cut(n1, G) + len(q)
        assert got.probs == alone.ask("s", q, ["y", "n"]).probs
    assert reader.tails.num_made == 2 and reader.tails.num_hits == 3
    for sid in "bc":
        reader.feed(sid, ids[:n2], "prompt")
        reader.read(sid)
    assert reader.make_tail("b") is False and reader.tails.num_replaced == 0   # c is there
    reader.ask("c", q, ["y", "n"])                         # the last one leaves it
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (2, 1, 1)
    check_refs(reader)
    reader.drop("b")                                       # a dropped session has no tip
    reader.drop("c")
    reader.feed("a", ids, "prompt")
    reader.read("a")
    assert reader.make_tail("a") is True
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (3, 2, 1)
    assert list(reader.tails._tips) == ["a"]
    check_refs(reader)


def test_the_idle_window_replaces_a_tip_tail_under_the_resident_cap(tiny):
    """make_tail counts the session's older tip tail, which keeping the newer one gives up, as
    room: a cap that holds the session and one tail lets the tip move with the session."""
    ids, q = rand_ids(2 * G + 150), rand_ids(10, 1)
    alone = _fresh(tiny, ids, max_tails=0)
    gdn_bytes = sum(c.nbytes + r.nbytes for c, r in alone._get("s").gdn)
    cap = alone.table.residency.resident_bytes(alone.table.resident) + \
        alone.store.pool.page_bytes + gdn_bytes + 10      # the session and one tail
    reader = _fresh(tiny, ids[:G + 150], resident_bytes=cap)
    assert reader.make_tail("s") is True
    reader.feed("s", ids, "prompt")
    reader.read("s")
    assert len(reader.tails) == 1                          # the older tip, under the cap
    assert reader.make_tail("s") is True
    st = reader.stats()
    assert (st["tails_made"], st["tails_replaced"], st["tails_held"]) == (2, 1, 1)
    assert reader.table.residency.resident_bytes(reader.table.resident) <= cap
    got = _ask(reader, q)
    assert got.probs == _ask(alone, q).probs and reader.tails.num_hits == 1
    check_refs(reader)


def test_forks_begun_on_a_tip_tail_give_their_bits_after_it_is_replaced(tiny):
    """A question in pieces, questions at once and a decoding begun on the session's tip tail
    hold a copy of its page and its states: the tip replaced (its page back, reused by other
    sessions' reads) changes none of their bits."""
    ids, n1 = rand_ids(2 * G + 170), G + 150
    reader = _fresh(tiny, ids[:n1])
    long_q, prompt = rand_ids(2 * G + 40, 3), rand_ids(12, 5)
    items = [(rand_ids(20 + 7 * i, i), list("abcd")) for i in range(2)]
    one = reader.begin_ask("s", long_q, list("abcd"))
    assert reader.advance(one)                             # a piece read, more to come
    many = reader.begin_ask_many("s", items)
    gen = reader.begin_generate("s", prompt, max_new_tokens=6)
    assert reader.tails.num_made == 1 and reader.tails.num_hits == 2
    reader.feed("s", ids, "prompt")
    reader.read("s")
    assert reader.make_tail("s") and reader.tails.num_replaced == 1
    for i in range(3):                                     # the freed page taken again
        reader.feed(f"x{i}", rand_ids(2 * G, 20 + i), "prompt")
        reader.read(f"x{i}")
    alone = _fresh(tiny, ids[:n1], max_tails=0)
    while reader.advance(one):
        pass
    assert reader.finish_ask(one).probs == _ask(alone, long_q).probs
    while reader.advance_many(many):
        pass
    for got, (q, ch) in zip(reader.finish_ask_many(many), items):
        assert got.probs == alone.ask("s", q, ch).probs
    while reader.advance(gen):
        pass
    assert reader.finish_generate(gen).ids == \
        alone.generate("s", prompt, max_new_tokens=6).ids
    check_refs(reader)


def test_read_rows_refuses_what_is_not_a_piece(tiny):
    reader = Reader(tiny, grid=G)
    kv = contiguous_kv(reader.adapter.spec, G, 2 * G)
    gdn = zero_gdn(reader.adapter.spec)
    for n, pos in [(0, 0), (100, 0), (G, 0), (64, 32), (64, -64), (64, 64.0), (64, True)]:
        with pytest.raises(ValueError, match="read_rows takes"):
            reader.adapter.read_rows(list(range(1000, 1000 + n)), pos, kv, gdn)
    with pytest.raises(ValueError, match="max_tails"):
        Reader(tiny, grid=G, max_tails=-1)


def test_a_question_on_a_kept_tail_is_flagged_past_max_positions_as_without_it(tiny_tensors):
    """beyond_max_positions is a fact of ids[:at] and the question: a question found on a kept
    tail (which forwards fewer ids) is flagged as the one that made the tail."""
    import dataclasses

    from adapters.model.config import PRESETS
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model
    cfg = dataclasses.replace(PRESETS["tiny"], max_position_embeddings=G + 150)
    model = build_model(cfg, tiny_tensors, ModelInfo("short", "x", True))
    reader = Reader(model, grid=G)
    reader.feed("s", rand_ids(G + 140), "prompt")
    reader.read("s")
    q_ids = rand_ids(20, 1)                                # ends at G + 160, past G + 150
    first, second = _ask(reader, q_ids), _ask(reader, q_ids)
    assert reader.tails.num_hits == 1 and second.num_forwarded_tokens == 140 - 128 + 20
    assert first.beyond_max_positions is True and second.beyond_max_positions is True
    short = _ask(reader, rand_ids(5, 2), G + 130)          # ends at G + 135: within
    assert short.beyond_max_positions is False


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_a_copy_of_the_tail_that_raises_leaves_no_page_held(tiny, monkeypatch, exc):
    """The second fork's copy of the tail's page raises (an interrupt, a device error): every
    page taken is given back, the kept tail stays, and the next questions are exact."""
    ids, q_ids = rand_ids(G + 150), rand_ids(12, 2)
    reader = _fresh(tiny, ids)
    want = _ask(reader, q_ids).probs                       # the tail kept
    copy_page, calls = reader.store.pool.copy_page, []

    def copy_once(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise exc("copy failed")
        copy_page(src, dst)

    monkeypatch.setattr(reader.store.pool, "copy_page", copy_once)
    with pytest.raises(exc, match="copy failed"):
        reader.ask_many("s", [(q_ids, list("abcd")), (q_ids, list("abcd"))])
    check_refs(reader)
    monkeypatch.undo()
    assert len(reader.tails) == 1 and _ask(reader, q_ids).probs == want
    check_refs(reader)


def test_a_pool_that_cannot_give_a_page_leaves_nothing_held(tiny, monkeypatch):
    """PoolFull at each page a begun ask_many takes (the tail's, the forks' copies, their
    pieces' pages): nothing is held after, and the questions are exact once pages come."""
    ids = rand_ids(G + 150)
    items = [(rand_ids(12, 2), list("abcd")), (rand_ids(2 * G + 5, 3), list("abcd"))]
    want = [a.probs for a in _fresh(tiny, ids, max_tails=0).ask_many("s", items)]
    reader = _fresh(tiny, ids)
    allocate, taken = reader.store.allocate, []

    def allocate_some(grow=True):
        if len(taken) >= limit:
            raise PoolFull("no page")
        taken.append(1)
        return allocate(grow)

    monkeypatch.setattr(reader.store, "allocate", allocate_some)
    limit = 100
    assert [a.probs for a in reader.ask_many("s", items)] == want
    num_pages = len(taken)              # the tail, two copies, the long one's 2 more pages
    assert num_pages == 5
    for limit in range(num_pages):
        taken.clear()
        reader.tails.drop_all(reader.store)
        with pytest.raises(PoolFull):
            reader.ask_many("s", items)
        check_refs(reader)
    monkeypatch.undo()
    assert [a.probs for a in reader.ask_many("s", items)] == want
    check_refs(reader)


def test_kept_tails_give_way_to_sessions_under_the_resident_cap(tiny):
    """A kept tail's page and states count in the resident bytes; past the cap the tails go
    before any session is parked (a session is worth more than a tail, which a question
    makes again), and the idle window makes none that would not fit."""
    a_ids, b_ids, q_ids = rand_ids(G + 150, 1), rand_ids(G + 150, 2), rand_ids(10, 3)
    both = _fresh(tiny, a_ids, max_tails=0)
    both.feed("b", b_ids, "prompt")
    both.read("b")
    cap = both.table.residency.resident_bytes(both.table.resident) + \
        both.store.pool.page_bytes // 2                   # both sessions, not one page more
    reader = _fresh(tiny, a_ids, resident_bytes=cap)
    reader.feed("b", b_ids, "prompt")
    reader.read("b")
    got = reader.ask("b", q_ids, list("abcd"))             # made its tail, given up after
    assert sorted(reader.table.resident) == ["b", "s"] and len(reader.tails) == 0
    assert reader.tails.num_made == 1 and reader.tails.num_evicted == 1
    assert got.probs == both.ask("b", q_ids, list("abcd")).probs
    assert reader.make_tail("s") is False and len(reader.tails) == 0   # no room for it
    check_refs(reader)
    roomy = _fresh(tiny, a_ids, resident_bytes=cap)                     # "s" alone
    before = roomy.table.residency.resident_bytes(roomy.table.resident)
    assert roomy.make_tail("s") is True and len(roomy.tails) == 1       # room for one
    gdn_bytes = sum(c.nbytes + r.nbytes for c, r in roomy._get("s").gdn)
    assert roomy.tails.state_bytes() == gdn_bytes > 0                   # its page and states
    assert roomy.table.residency.resident_bytes(roomy.table.resident) - before == \
        roomy.store.pool.page_bytes + gdn_bytes
    assert roomy.ask("s", q_ids, list("abcd")).probs == \
        both.ask("s", q_ids, list("abcd")).probs and roomy.tails.num_hits == 1
    check_refs(roomy)


def test_a_tail_kept_across_pool_growth_and_a_disk_restore_gives_the_same_bits(tiny, tmp_path):
    """The pool grows (a new block, the pages copied in) while a tail is kept: forks still copy
    its page right; a session parked to disk and restored, or read by a new reader on the
    folder, asks on a kept tail or a new one with the bits of a reader that keeps none."""
    ids, q_ids = rand_ids(G + 150), rand_ids(12, 2)
    want = _ask(_fresh(tiny, ids, max_tails=0), q_ids).probs
    reader = _fresh(tiny, ids, disk_dir=tmp_path)
    assert reader.make_tail("s") is True
    num_pages = reader.store.pool.num_pages
    for i in range(4):
        reader.feed(f"x{i}", rand_ids(4 * G, 10 + i), "prompt")
        reader.read(f"x{i}")
    assert reader.store.pool.num_pages > num_pages
    assert _ask(reader, q_ids).probs == want and reader.tails.num_hits == 1
    reader.table.park("s")
    assert _ask(reader, q_ids).probs == want and reader.tails.num_hits == 2
    check_refs(reader)
    reader.close()
    assert len(reader.tails) == 0
    check_refs(reader)
    again = Reader(tiny, grid=G, disk_dir=tmp_path)
    assert _ask(again, q_ids).probs == want and again.tails.num_made == 1
    check_refs(again)


def test_graph_stats_name_the_runners_a_kept_tail_made(tiny):
    """The graph adapter's counts (Adapter.graph_stats, status's `graphs`): on the CPU its
    runners run their bodies without graphs, so every count of graphs is 0, but the runners
    made (the chunk runner, the question's bucket, the tail's states-keeping runner) are
    named by their rows; the eager adapter has none."""
    n = 3 * G + 200
    reader = _fresh(tiny, rand_ids(n), cuda_graphs=True)
    assert reader.adapter.graph_stats()["num_runners"] == 1      # the chunk runner alone
    _ask(reader, rand_ids(40, 1))
    stats = reader.adapter.graph_stats()
    cut, line = fork.tail_cut(n, G), n // G * G
    assert stats["kept_rows"] == [cut - line] == [192]
    assert stats["question_rows"] == [reader.adapter.fork_rows(n - cut + 40)]
    assert stats["num_runners"] == 3
    assert (stats["num_graphs"], stats["num_captures"], stats["num_failed_captures"],
            stats["capture_s"]) == (0, 0, 0, 0.0)
    assert _fresh(tiny, rand_ids(n)).adapter.graph_stats() == {}
    warm = Reader(tiny, grid=G, cuda_graphs=True)
    warm.warm_up()                          # every tail's runner made (captured on CUDA)
    assert warm.adapter.graph_stats()["kept_rows"] == fork.tail_rows(G) == [64, 128, 192]
    assert fork.tail_rows(512) == [128, 192, 256, 320, 384, 448] and fork.tail_rows(64) == []
