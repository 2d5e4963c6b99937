"""The adapter seam: every adapter honours the interface's contract (shapes, dtypes, KV rows
written, GDN states returned new), the reference adapter runs the pure-torch kernels whatever
the model's own set, make_adapter is the one place graphs or eager is chosen, and a reader
built on an adapter refuses options that are the adapter's."""
import pytest
import torch
from paged import paged_kv

from adapters import EagerAdapter, GraphAdapter, ReferenceAdapter, make_adapter, state_spec
from adapters.model.kernels import KernelSet
from block_store.memory.layout import clone_gdn, zero_gdn
from shadow_plugin import Reader

G = 64


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(1000, 240000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("make", [EagerAdapter, ReferenceAdapter,
                                  lambda m, g: GraphAdapter(m, g)])
def test_every_adapter_keeps_the_contract(tiny, make):
    adapter = make(tiny, G)
    spec = state_spec(tiny)
    assert adapter.spec == spec and adapter.grid == G
    kv, gdn = paged_kv(spec, G, G + max(adapter.fork_rows(5), 16)), zero_gdn(spec)  # fork room
    before = clone_gdn(gdn)
    new = adapter.read_chunk(_ids(G, 1), 0, kv, gdn)
    assert all(torch.equal(a, b) for pa, pb in zip(gdn, before) for a, b in zip(pa, pb))
    assert [(c.shape, r.shape, r.dtype) for c, r in new] == \
        [((spec.conv_dim, spec.conv_width), spec.recurrent_shape, torch.float32)] * spec.num_gdn
    written = paged_kv(spec, G, G + max(adapter.fork_rows(5), 16)).gather(G)  # the noise
    assert all(not torch.equal(k, w) for (k, _), (w, _) in zip(kv.gather(G), written))
    logits = adapter.fork_logits(_ids(5, 2), G, kv, new, [11, 12, 13])
    assert logits.shape == (3,) and logits.dtype == torch.float32
    assert adapter.fork_rows(5) >= 5
    out = adapter.decode(_ids(3, 3), G, kv, new, 4, set())
    assert len(out.ids) == 4 and out.num_steps == 3 and out.prefill_ms > 0


def test_the_reference_adapter_runs_the_pure_torch_kernels(tiny, monkeypatch):
    """With the model's kernel set broken, the reference adapter still reads (it never asks
    the model's set) and gives the eager path's CPU bits; the eager adapter uses the broken set."""
    ids = _ids(2 * G, 4)
    want = Reader(EagerAdapter(tiny, G))
    want.feed("s", ids, "prompt")
    want.read("s")

    def broken(*a, **k):
        raise RuntimeError("the model's own kernel set was used")
    monkeypatch.setattr(tiny, "kernels", KernelSet("broken", broken, broken, broken))
    ref = Reader(ReferenceAdapter(tiny, G))
    ref.feed("s", ids, "prompt")
    ref.read("s")
    got, expected = ref.state_tensors("s"), want.state_tensors("s")
    assert all(torch.equal(got[k], expected[k]) for k in expected) and ref.check_exact("s")
    assert ref.adapter.identity().kernels == "torch eager"
    with pytest.raises(RuntimeError, match="own kernel set"):
        EagerAdapter(tiny, G).read_chunk(ids[:G], 0, paged_kv(state_spec(tiny), G, G),
                                         zero_gdn(state_spec(tiny)))


def test_make_adapter_is_where_graphs_or_eager_is_chosen(tiny):
    assert type(make_adapter(tiny, G)) is EagerAdapter          # the CPU's default
    assert type(make_adapter(tiny, G, cuda_graphs=True)) is GraphAdapter
    assert make_adapter(tiny, G, cuda_graphs=True).path == "eager:sdpa"
    assert Reader(tiny, grid=G).path == "eager" and Reader(tiny, grid=G).adapter.grid == G


def test_a_reader_on_an_adapter_refuses_the_adapters_options(tiny):
    adapter = EagerAdapter(tiny, G)
    assert Reader(adapter).config.grid == G and Reader(adapter, grid=G).adapter is adapter
    with pytest.raises(ValueError, match="grid"):
        Reader(adapter, grid=2 * G)
    with pytest.raises(ValueError, match="pass grid, cuda_graphs"):
        Reader(adapter, cuda_graphs=True)
    with pytest.raises(ValueError, match="runners read chunks of 64"):
        GraphAdapter(tiny, 2 * G, runners=GraphAdapter(tiny, G).runners)
