"""Issue 34: a question's ids read in grid pieces and a summary decoded in bursts give the bits
one forward and one decode gave before (the path before the change, run here by hand through the
same adapter), and the same whatever happens to the session between two pieces."""
import torch
from helpers import check_refs, fork_logits, rand_ids  # noqa: E402

from block_store.session import fork_pages
from shadow_plugin import Reader
from shadow_plugin.chat.questions import STOP_IDS

G = 64


def _one_forward_logits(reader: Reader, session: str, q_ids: list[int], letters: list[int]):
    """The question's letters' logits as before pieces: ids[C:] + question in one forward."""
    st = reader._get(session)
    fwd = st.ids[st.committed:] + q_ids
    store = reader.table.store
    kv, pages = fork_pages(store, st, st.committed + reader.adapter.fork_rows(len(fwd)))
    try:
        return reader.adapter.fork_logits(fwd, st.committed, kv, st.gdn, letters)
    finally:
        store.release_pages(pages)


def test_a_long_question_read_in_pieces_answers_as_one_forward(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(5 * G + 17), "prompt")
    reader.read("s")
    q_ids = rand_ids(9 * G + 5, 1)                  # the tail and 9 pieces, then the rest
    letters = [1000 + i for i in range(4)]
    want = torch.softmax(_one_forward_logits(reader, "s", q_ids, letters), dim=-1).tolist()
    pending = reader.begin_ask("s", q_ids, list("abcd"))
    num_steps = 0
    while reader.advance(pending):
        num_steps += 1
    assert num_steps == 9
    ans = reader.finish_ask(pending)
    # the letters' ids differ (the tokenizer's): compare the forward through letters given
    got = torch.softmax(fork_logits(reader, "s", q_ids, letters)[0], dim=-1).tolist()
    assert got == want
    assert ans.num_forwarded_tokens == 17 + len(q_ids)
    assert reader.ask("s", q_ids, list("abcd")).probs == ans.probs      # one call, same bits
    check_refs(reader)


def test_an_answer_holds_whatever_the_session_does_between_pieces(tiny):
    reader = Reader(tiny, grid=G)
    ids = rand_ids(4 * G + 3)
    reader.feed("s", ids, "prompt")
    reader.read("s")
    q_ids = rand_ids(6 * G, 2)
    want = reader.ask("s", q_ids, ["yes", "no"])
    pending = reader.begin_ask("s", q_ids, ["yes", "no"])
    reader.advance(pending)
    reader.feed("s", rand_ids(3 * G, 9), "prompt")     # a rewrite from 0: its pages go
    reader.read("s")
    reader.feed("t", rand_ids(8 * G, 5), "prompt")     # and others take pool pages
    reader.read("t")
    while reader.advance(pending):
        reader.drop("t") if "t" in reader.sessions() else None
    got = reader.finish_ask(pending)
    assert got.probs == want.probs and got.at == want.at
    assert reader.check_exact("s")
    check_refs(reader)


def test_a_decode_in_bursts_gives_the_ids_of_one_decode(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(3 * G + 9), "prompt")
    reader.read("s")
    prompt = rand_ids(4 * G + 1, 3)                      # read in pieces, then the last forward
    st = reader._get("s")
    store = reader.table.store
    kv, pages = fork_pages(store, st, len(st.ids) + len(prompt) + 40)
    try:
        want = reader.adapter.decode(st.ids[st.committed:] + prompt, st.committed, kv, st.gdn,
                                     40, set())
    finally:
        store.release_pages(pages)
    for burst in (1, 3, 40):
        pending = reader.begin_generate("s", prompt, 40, stop_ids=())
        while reader.advance(pending, burst):
            pass
        gen = reader.finish_generate(pending)
        assert gen.ids == want.ids and len(gen.ids) == 40
    with_stops = reader.generate("s", prompt, 40)
    cut = next((i + 1 for i, t in enumerate(want.ids) if t in STOP_IDS), 40)
    assert with_stops.ids == want.ids[:cut]
    check_refs(reader)


def test_a_cancelled_question_gives_its_pages_back(tiny):
    reader = Reader(tiny, grid=G)
    reader.feed("s", rand_ids(2 * G + 1), "prompt")
    reader.read("s")
    pending = reader.begin_ask("s", rand_ids(5 * G, 4), ["a", "b"])
    reader.advance(pending)
    reader.cancel(pending)
    reader.cancel(pending)                                # twice: nothing more
    check_refs(reader)
