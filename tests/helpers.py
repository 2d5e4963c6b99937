"""Test helpers shared by the layers (tests/ is on the path of every test through conftest.py):
random ids, readers on a disk folder and a session parked there, the reference counts a reader
must keep, a question's logits through a reader's fork, the metrics the Grafana dashboard
queries, fla's autotuner and an autotune key, the disk tier's test identity and pages. KV pools
of pages for the attention kernels: paged.py; the service on a loopback port: serving.py (apart,
so that the GPU tests need no server packages on the device)."""
import contextlib
import json
import random
import re
from collections import Counter
from pathlib import Path

import torch

from block_store import FileIdentity
from block_store.memory.keys import identity_key
from shadow_plugin.reader.reader import Reader

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "shadow-reader.json"


def rand_ids(n: int, rng: random.Random | int = 0) -> list[int]:
    """n ordinary token ids in [1000, 240000) (no special ids), from `rng` or a seed."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    return [rng.randrange(1000, 240000) for _ in range(n)]


def vocab_ids(rng: random.Random, n: int) -> list[int]:
    """n ids anywhere in Qwen3.5's vocabulary [0, 248320), special ids included."""
    return [rng.randrange(248320) for _ in range(n)]


def parking_reader(model, disk, grid: int = 64, **kw) -> Reader:
    """A reader that parks every session it is not using (resident_bytes=0) on a disk folder."""
    return Reader(model, grid=grid, resident_bytes=0, disk_dir=disk, **kw)


def output_session(reader: Reader, sid: str, n: int = 300, seed: int = 0) -> None:
    """Session `sid`: a prompt of n vocab_ids read, then 40 output ids (not read)."""
    rng = random.Random(seed)
    reader.feed(sid, vocab_ids(rng, n), "prompt")
    reader.read(sid)
    reader.feed(sid, vocab_ids(rng, 40), "output")


def disk_reader(model, disk, grid: int, **kw) -> Reader:
    """A reader on a disk folder with 2 checkpoints a session (what the crash, spill and disk
    tests use), `kw` over that."""
    return Reader(model, grid=grid, **{"max_checkpoints": 2, "disk_dir": disk, **kw})


def check_refs(reader: Reader) -> None:
    """Each page's references = the resident sessions holding it (+ prepared fork bases, +
    kept questions' tails); each GDN entry's = the checkpoints and tip entries naming it.
    AssertionError otherwise."""
    pages, entries = Counter(p.index for p in reader.tails.pages()), Counter()
    states = list(reader.table.resident.values()) + [s.state for s in reader._scratch.values()]
    for stt in states:
        pages.update(p.index for p in stt.pages)
        entries.update(e.key for e in [c.entry for c in stt.checkpoints] + stt.tip)
    for page in reader.table.store.manager.pages:
        assert page.refs == pages[page.index], (page.index, page.refs, pages[page.index])
    for key, e in reader.table.store.gdn.entries.items():
        assert e.refs == entries[key]


def fork_logits(reader: Reader, session: str, q_ids: list[int], letters: list[int],
                tails=None, between=None) -> tuple[torch.Tensor, int]:
    """The letters' logits [len(letters)] fp32 (a copy, the device synchronised) of the
    question q_ids at the session's end through the reader's own fork (fork.start, its
    pieces, fork.last_logits), calling between() after each piece; and the pieces read.
    tails: the reader's kept tails to use and keep (reader.tails), or None (none)."""
    from shadow_plugin.reader import fork
    st = reader._get(session)
    store, adapter = reader.store, reader.adapter
    at = len(st.ids)
    fw = fork.start(adapter, reader.config, store, st, session, q_ids, at,
                    fork.question_padding(adapter, at, len(q_ids)), tails=tails)
    num_pieces = 0
    try:
        while fork.forward_piece(adapter, store, fw):
            num_pieces += 1
            if between is not None:
                between()
        logits = fork.last_logits(adapter, store, fw, letters)
        adapter.sync()
        return logits.clone(), num_pieces
    finally:
        fork.release(store, fw)


def logits_by_hand(adapter, ids: list[int], q_ids: list[int],
                   letters: list[int]) -> torch.Tensor:
    """The letters' logits [len(letters)] fp32 (a copy, the device synchronised) of the
    question q_ids after `ids`, forwarded by hand through the adapter on a KV of its own as
    shadow_plugin.reader.fork's module doc says: whole chunks from 0, the tail ids[line:cut]
    (cut: the multiple of 64 at or below the end when that is a quarter of a grid (rounded up
    to 64) or more past the line, written out here, not fork.tail_cut), then the rest and the
    question from cut."""
    from block_store import contiguous_kv
    from block_store.memory.layout import zero_gdn
    g, at = adapter.grid, len(ids)
    line = at // g * g
    cut = at // 64 * 64 if at // 64 * 64 - line >= -(-(g // 4) // 64) * 64 else line
    kv = contiguous_kv(adapter.spec, g, at + len(q_ids) + g)
    gdn = zero_gdn(adapter.spec)
    for pos in range(0, line, g):
        gdn = adapter.read_chunk(ids[pos:pos + g], pos, kv, gdn)
    if cut > line:
        gdn = adapter.read_rows(ids[line:cut], line, kv, gdn)
    out = adapter.fork_logits(ids[cut:] + q_ids, cut, kv, gdn, letters)
    adapter.sync()
    return out.clone()


def dashboard_metrics(prefix: str) -> set[str]:
    """Metric names starting with `prefix` in the Grafana dashboard's queries."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return {m for e in exprs for m in re.findall(re.escape(prefix) + r"[a-zA-Z0-9_:]+", e)}


# an autotune key of fla's chunk_fwd_kernel_o (its shape arguments and dtype), set by hand
FLA_KEY = (32, 32, 128, 128, 64, False, "torch.bfloat16")


def fla_tuner(name: str = "chunk_fwd_kernel_o"):
    """fla's autotuner of kernel `name`, its module loaded (needs fla-core and triton)."""
    import fla.ops.common.chunk_o  # noqa: F401  (loads the kernel's module)

    from adapters.model import autotune
    return next(t for t in autotune.autotuners() if t.kernel_name == name)


# the identity of the disk tier's files in its tests, and the key every page key chain there
# starts from
DISK_IDENT = FileIdentity("fp", "{}", 64, "float32", "cpu", "torch eager")
DISK_ROOT = identity_key(DISK_IDENT.as_meta())


def disk_page(seed: int) -> torch.Tensor:
    """A page's kv [num_attention=2, 2, G=64, Hkv=2, D=8] float32 from `seed`."""
    return torch.randn(2, 2, 64, 2, 8, generator=torch.Generator().manual_seed(seed))


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to n inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
