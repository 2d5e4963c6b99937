"""Every real session of the shared data set (evals.data: $SHADOW_DATA_DIR/sessions) replayed
exactly on random:tiny (`shadow-reader replay FILE --model random:tiny --check-exact`). Sessions above
SHADOW_TEST_MAX_IDS rendered ids (default 20,000) are skipped to keep CI short; set it to 0 for
all of them."""
import io
import os

import pytest

from evals.data import data_dir
from evals.replay import load_session, replay_turns
from shadow_plugin.chat.host_view import host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.router import ROUTER
from shadow_plugin.chat.tokenizer import load_tokenizer
from shadow_plugin.reader.reader import Reader

DATA = data_dir() / "sessions"
FILES = sorted(DATA.glob("*.json")) if DATA.is_dir() else []
MAX_IDS = int(os.environ.get("SHADOW_TEST_MAX_IDS", "20000"))


@pytest.mark.skipif(not FILES, reason=f"no sessions at {DATA}")
@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_real_session_replays_exactly(tiny, path):
    tok = load_tokenizer()
    messages, tools = load_session(path)
    turns = host_turns(messages, tools or None, Renderer.from_model_dir(None), tok)
    if MAX_IDS and turns and len(turns[-1].prompt_ids) > MAX_IDS:
        pytest.skip(f"{len(turns[-1].prompt_ids)} ids > SHADOW_TEST_MAX_IDS={MAX_IDS}")
    reader = Reader(tiny, grid=512, tokenizer=tok)
    totals = replay_turns(reader, path.stem, turns, ROUTER, tok, check_exact=True,
                          out=io.StringIO()).as_dict()
    assert totals["exact"] is True and totals["turns"] == len(turns) > 0
    assert totals["num_read"] == reader.committed(path.stem) + totals["num_rolled_back"]
    assert totals["num_reread"] == sum(reader.stats()["reread_tokens"].values())


def test_state_bytes_counts_every_tensor(tiny):
    """state_bytes (KV capacity, GDN states, one copy of them per entry held, a checkpoint in
    the tip ring once) equals the sum over every tensor the state holds."""
    import random

    from block_store.session import state_bytes
    from shadow_plugin.reader.reader import Reader
    rng = random.Random(7)
    r = Reader(tiny, grid=64)
    ids = [rng.randrange(1000, 240000) for _ in range(300)]
    r.feed("s", ids, "prompt")
    r.read("s")
    for cut in (130, 200):                      # later prompts take checkpoints at their lines
        r.feed("s", ids[:cut] + [5] * 100, "prompt")
        r.read("s")
    st = r.table.resident["s"]
    assert st.checkpoints
    page_bytes = r.table.store.pool.page_bytes
    entries = {id(e): e for e in [cp.entry for cp in st.checkpoints] + st.tip}   # each once
    assert len(entries) < len(st.checkpoints) + len(st.tip)      # the ring meets a checkpoint
    every = [*(x for g in st.gdn for x in g),
             *(x for e in entries.values() for g in e.states for x in g)]
    assert state_bytes(st, page_bytes) == len(st.pages) * page_bytes + sum(x.nbytes for x in every)
    assert page_bytes == 2 * tiny.cfg.num_key_value_heads * tiny.cfg.head_dim * 64 * 4 * \
        len(tiny.cfg.full_layers)                           # K and V rows of a page, fp32
