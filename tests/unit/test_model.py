"""The model against transformers' Qwen3_5ForCausalLM and the GDN kernels against each other."""
import pytest
import torch
from paged import paged_kv

from adapters import spec_for
from adapters.model import ref
from adapters.model.config import PRESETS
from adapters.model.export import save_hf_dir
from block_store.memory.layout import zero_gdn

transformers = pytest.importorskip("transformers")


def _empty_kv(cfg, rows, seed=0):
    """Pages for `rows` rows (64 a page), shuffled among spare pages of noise."""
    return paged_kv(spec_for(cfg, "cpu", torch.float32), 64, rows, seed)


@pytest.fixture(scope="module")
def hf_model(tiny_tensors, tmp_path_factory):
    path = save_hf_dir(PRESETS["tiny"], tiny_tensors, tmp_path_factory.mktemp("hf"))
    return transformers.Qwen3_5ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_logits_and_states_match_transformers(tiny, hf_model):
    cfg = tiny.cfg
    ids = torch.randint(0, 248000, (200,), generator=torch.Generator().manual_seed(1))
    cache = transformers.DynamicCache(config=hf_model.config)
    with torch.no_grad():
        want = hf_model(ids[None], past_key_values=cache, use_cache=True).logits[0]
    kv, gdn, pos, got = _empty_kv(cfg, 256), zero_gdn(spec_for(cfg, "cpu", torch.float32)), 0, []
    for n in (64, 64, 64, 8):                      # chunked, with a ragged last chunk
        h, gdn = tiny(ids[pos:pos + n], pos, kv, gdn)
        got.append(tiny.logits(h))
        pos += n
    got = torch.cat(got)
    assert (got - want).abs().max() < 1e-4 * want.abs().max()
    for j, layer in enumerate(cfg.linear_layers):
        rec = cache.layers[layer].recurrent_states[0][0]
        assert torch.allclose(gdn[j][1], rec, atol=1e-6, rtol=1e-4)
        conv = cache.layers[layer].conv_states[0][0]
        assert torch.allclose(gdn[j][0], conv, atol=1e-6)
    for (k, _), layer in zip(kv.gather(200), cfg.full_layers):
        assert torch.allclose(k.transpose(0, 1), cache.layers[layer].keys[0], atol=1e-5)


def _gdn_inputs(t, hk=2, hv=4, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = ref.l2norm(torch.randn(t, hk, d, generator=g))
    k = ref.l2norm(torch.randn(t, hk, d, generator=g))
    v = torch.randn(t, hv, d, generator=g)
    gate = -torch.rand(t, hv, generator=g) * 0.5
    beta = torch.rand(t, hv, generator=g)
    s0 = torch.randn(hv, d, d, generator=g) * 0.1
    return q, k, v, gate, beta, s0


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_chunked_gdn_equals_token_recurrence(t):
    q, k, v, g, b, s0 = _gdn_inputs(t)
    o1, s1 = ref.chunk_gated_delta_rule(q, k, v, g, b, s0)
    o2, s2 = ref.recurrent_gated_delta_rule(q, k, v, g, b, s0)
    assert torch.allclose(o1, o2, atol=1e-5) and torch.allclose(s1, s2, atol=1e-5)


def test_chunked_gdn_split_on_64_grid_is_bit_exact():
    q, k, v, g, b, s0 = _gdn_inputs(256)
    o, s = ref.chunk_gated_delta_rule(q, k, v, g, b, s0)
    oa, sa = ref.chunk_gated_delta_rule(q[:128], k[:128], v[:128], g[:128], b[:128], s0)
    ob, sb = ref.chunk_gated_delta_rule(q[128:], k[128:], v[128:], g[128:], b[128:], sa)
    assert torch.equal(torch.cat([oa, ob]), o) and torch.equal(sb, s)


def test_conv_with_carried_state_equals_whole():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(50, 12, generator=g), torch.randn(12, 4, generator=g)
    zero = torch.zeros(12, 4)
    y, s = ref.causal_conv1d(x, w, zero)
    ya, sa = ref.causal_conv1d(x[:2], w, zero)      # shorter than the kernel width
    yb, sb = ref.causal_conv1d(x[2:], w, sa)
    assert torch.allclose(torch.cat([ya, yb]), y, atol=1e-6) and torch.equal(sb, s)
    assert torch.equal(s, x[-4:].t())               # the state is the last W raw inputs


@pytest.mark.parametrize("t", [1, 3, 64])
def test_conv_gates_twin_of_the_conv_then_the_gates(t):
    """ops.conv_gates (the fused op set's conv and gates in one function) against its twin
    ref.causal_conv1d then ops.gdn_gates, in bf16 on strided projection slices as the fused
    projections give them: outputs within bf16 rounding, the new state the same bits, v
    contiguous; also through torch.compile (what the runners use)."""
    from adapters.model import ops
    g = torch.Generator().manual_seed(t)
    hk, kd, hv, vd, w = 2, 16, 4, 8, 4
    d = 2 * hk * kd + hv * vd
    proj = torch.randn(t, d + 2 * hv + 5, generator=g).bfloat16()     # a wider GEMM output
    qkv, b, a = proj[:, :d], proj[:, d:d + hv], proj[:, d + hv:d + 2 * hv]
    weight, state = torch.randn(d, w, generator=g), torch.randn(d, w, generator=g).bfloat16()
    a_log, dt_bias = torch.randn(hv, generator=g), torch.randn(hv, generator=g)
    mixed, want_state = ref.causal_conv1d(qkv, weight, state)
    want = ops.gdn_gates(mixed, b, a, a_log, dt_bias, hk, kd, hv, vd)
    for fn in (ops.conv_gates, torch.compile(ops.conv_gates, dynamic=False, fullgraph=True)):
        *got, got_state = fn(qkv, weight, state, b, a, a_log, dt_bias, hk, kd, hv, vd)
        assert torch.equal(got_state, want_state) and got[2].is_contiguous()
        for x, y in zip(got, want):
            assert x.dtype == y.dtype and x.shape == y.shape
            assert torch.allclose(x.float(), y.float(), rtol=2e-2, atol=2e-2), \
                (x.float() - y.float()).abs().max()             # a bf16 ulp or two


def _with_layers(types):
    import dataclasses

    from adapters.model.config import PRESETS
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model, random_tensors
    cfg = dataclasses.replace(PRESETS["tiny"], layer_types=types)
    return build_model(cfg, random_tensors(cfg), ModelInfo("tiny-" + "".join(t[0] for t in types),
                                                           "", True))


@pytest.mark.parametrize("order", [None, "fllf", "ffll"])
def test_graph_segments_equal_the_eager_forward_bitwise(tiny, order):
    """The CUDA-graph runner's split of the forward into segments cut at the full-attention
    layers (run without graphs on the CPU, attention between) gives the eager forward's bits:
    hidden, KV rows and GDN states; also with the attention first, in the middle, back to back."""
    from adapters.model.config import FULL, LINEAR
    from adapters.runners.graphs import ChunkGraphs
    from shadow_plugin.reader.reader import Reader
    if order:
        tiny = _with_layers(tuple(FULL if c == "f" else LINEAR for c in order))
    cfg, t = tiny.cfg, 64
    ids = torch.randint(0, 248000, (3 * t,), generator=torch.Generator().manual_seed(5))
    runs = []
    for seed, fn in enumerate((tiny, ChunkGraphs(tiny, t).run)):      # other page orders
        kv, gdn = _empty_kv(cfg, 3 * t, seed), zero_gdn(spec_for(cfg, "cpu", torch.float32))
        for pos in range(0, 3 * t, t):
            h, gdn = fn(ids[pos:pos + t], pos, kv, gdn)
        runs.append((h, kv.gather(3 * t), gdn))
    (h1, kv1, g1), (h2, kv2, g2) = runs
    assert torch.equal(h1, h2)
    assert all(torch.equal(a, b) for p, q in zip(kv1, kv2) for a, b in zip(p, q))
    assert all(torch.equal(a, b) for p, q in zip(g1, g2) for a, b in zip(p, q))
    r = Reader(tiny, grid=t, cuda_graphs=True)
    r.feed("s", ids.tolist(), "prompt")
    r.read("s")
    assert r.committed("s") == 3 * t and r.check_exact("s")


def test_kept_states_give_the_same_bits_across_sessions_and_in_place_changes(tiny,
                                                                              monkeypatch):
    """A runner that keeps its output states as its next inputs (keep_states, the reader's
    chunk runner) skips the copy in only for the very states it returned, unchanged: chunks of
    two sessions interleaved, a state changed in place, and states passed as equal copies all
    give the bits of a runner that copies every time."""
    from adapters.runners import graphs, slots
    same, seen = slots.same, []
    monkeypatch.setattr(slots, "same", lambda *a: seen.append(same(*a)) or seen[-1])
    cfg, t = tiny.cfg, 64
    gen = torch.Generator().manual_seed(9)
    ids = {s: torch.randint(0, 248000, (3 * t,), generator=gen).tolist() for s in "ab"}
    runs = []
    for keep in (False, True):
        runner = graphs.ChunkGraphs(tiny, t, keep_states=keep)
        kv = {s: _empty_kv(cfg, 3 * t) for s in "ab"}
        gdn = {s: zero_gdn(spec_for(cfg, "cpu", torch.float32)) for s in "ab"}
        for pos, s in [(0, "a"), (t, "a"), (2 * t, "a"), (0, "b"), (t, "b")]:
            if (pos, s) == (2 * t, "a"):
                gdn[s][0][1].mul_(0.5)               # changed in place since it was returned
            if (pos, s) == (t, "b"):
                gdn[s] = [(c.clone(), r.clone()) for c, r in gdn[s]]      # equal, not the same
            h, gdn[s] = runner.run(ids[s][pos:pos + t], pos, kv[s], gdn[s])
        runs.append((h, gdn, runner))
    (h1, g1, _), (h2, g2, runner) = runs
    assert torch.equal(h1, h2) and runner.slots.fed is not None
    assert seen == [True, False, False, False]      # skipped once: a's second chunk
    assert all(torch.equal(x, y) for s in "ab" for p, q in zip(g1[s], g2[s]) for x, y in zip(p, q))


def test_runner_refuses_attentions_it_cannot_run_and_names_its_path(tiny):
    """torch's FlashAttention-2 reads no page table: refused everywhere with the reason; FA4
    needs a Hopper GPU: refused on the CPU; the reader's path (written into spilled files)
    names how chunks are read."""
    from adapters.runners.graphs import ChunkGraphs
    from adapters.runners.runners import Runners
    from shadow_plugin.reader.reader import Reader
    with pytest.raises(ValueError, match="FlashAttention-2 reads no page table.*got 'flash'"):
        ChunkGraphs(tiny, 64, attention="flash")
    with pytest.raises(ValueError, match="'fa4' there on Hopper.*got 'fa4' on cpu"):
        ChunkGraphs(tiny, 64, attention="fa4")
    assert Runners(tiny, 64).path == "eager:sdpa" and not Runners(tiny, 64).row_invariant
    assert Runners(tiny, 64, attention="table", fused=True).path == \
        "eager:table 128x32x8x2+fused+proj"
    assert Reader(tiny, grid=64).path == "eager"
    assert Reader(tiny, grid=64, cuda_graphs=True).adapter.identity().kernels == "torch eager:sdpa"


def test_row_invariant_chunks_are_off_on_the_cpu_and_refused_where_the_kernels_do_not_fit(
        tiny, monkeypatch):
    """Runners' row_invariant defaults to off on the CPU (model.rowwise's kernels are Triton's);
    asked for a model whose heads they do not take, it is refused with the head dims."""
    from adapters.model import rowwise
    from adapters.runners.runners import Runners
    assert not Runners(tiny, 64).row_invariant and not Runners(tiny, 64, fused=True).row_invariant
    from adapters import make_adapter
    from shadow_plugin.reader.reader import Reader
    assert Reader(tiny, grid=64, cuda_graphs=True, row_invariant=False).adapter.runners \
        .row_invariant is False                               # the reader passes it on
    with pytest.raises(ValueError, match="row_invariant=True choose how the CUDA-graph runners"):
        make_adapter(tiny, 64, cuda_graphs=False, row_invariant=True)
    monkeypatch.setattr(rowwise, "fits", lambda cfg: False)
    with pytest.raises(ValueError, match=r"row-invariant chunks: .*head_dim \d+, rotary_dim"):
        Runners(tiny, 64, row_invariant=True)


def test_a_one_token_forward_takes_the_step_kernel(tiny):
    """Decode steps (T = 1) go through KernelSet.gdn_step (the recurrence, one kernel on CUDA),
    whose result is the chunked form's within fp32 rounding."""
    import dataclasses

    from adapters.model.kernels import TORCH
    calls = []

    def spy(*args):
        calls.append(args[0].shape[0])
        return ref.recurrent_gated_delta_rule(*args)

    cfg = tiny.cfg
    kv, gdn = _empty_kv(cfg, 8), zero_gdn(spec_for(cfg, "cpu", torch.float32))
    ids = torch.tensor([1234])
    try:
        tiny.kernels = dataclasses.replace(TORCH, gdn_step=ref.chunk_gated_delta_rule)
        h_chunked, g_chunked = tiny(ids, 0, kv, gdn)
        tiny.kernels = dataclasses.replace(TORCH, gdn_step=spy)
        h_step, g_step = tiny(ids, 0, _empty_kv(cfg, 8), gdn)
    finally:
        tiny.kernels = TORCH
    assert calls == [1] * len(cfg.linear_layers)
    assert (h_step - h_chunked).abs().max().item() < 1e-5
    assert all((a - b).abs().max().item() < 1e-5 for p, q in zip(g_step, g_chunked)
               for a, b in zip(p, q))


def test_fused_projections_are_views_and_close_to_the_four_gemms(tiny):
    """model.fuse: the parameters become row views of one weight per layer (no copy kept, the
    eager forward's bits unchanged, a second call finds the same weights); one GEMM gives the
    separate projections' values within fp32 rounding."""
    from adapters.model.config import PRESETS
    from adapters.model.fuse import fuse_projections
    from adapters.model.qwen35 import ModelInfo
    from adapters.model.weights import build_model, random_tensors
    cfg = PRESETS["tiny"]
    model = build_model(cfg, random_tensors(cfg), ModelInfo("tiny-fuse", "", True))
    ids = torch.randint(0, 248000, (64,), generator=torch.Generator().manual_seed(2))
    before = model(ids, 0, _empty_kv(cfg, 64), zero_gdn(spec_for(cfg, "cpu", torch.float32)))[0]
    f = fuse_projections(model)
    g = model.layers[0].linear_attn
    w = f.gdn_in[0]
    assert w.shape == (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads, cfg.hidden_size)
    assert g.in_proj_z.weight.data_ptr() == w.data_ptr() + cfg.conv_dim * cfg.hidden_size * w.element_size()
    assert torch.equal(w[cfg.conv_dim:cfg.conv_dim + cfg.value_dim], g.in_proj_z.weight)
    again = fuse_projections(model)
    assert all(again.mlp_in[i].data_ptr() == f.mlp_in[i].data_ptr() for i in f.mlp_in)
    after = model(ids, 0, _empty_kv(cfg, 64), zero_gdn(spec_for(cfg, "cpu", torch.float32)))[0]
    assert torch.equal(before, after)
    x = torch.randn(5, cfg.hidden_size)
    state = (torch.zeros(cfg.conv_dim, cfg.linear_conv_kernel_dim),
             torch.zeros(cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                         cfg.linear_value_head_dim))
    a = g(x, *state, model.kernels)
    b = g(x, *state, model.kernels, proj=w)
    assert all((p - q).abs().max().item() < 1e-5 for p, q in zip(a, b))
    mlp = model.layers[0].mlp
    assert (mlp(x) - mlp(x, gate_up=f.mlp_in[0])).abs().max().item() < 1e-5
    i = next(iter(f.attn_in))
    attn = model.layers[i].self_attn
    from adapters.model.layers import rope_cos_sin
    rope = rope_cos_sin(torch.arange(5), cfg.rotary_dim, cfg.rope_theta, torch.float32)
    for p, q in zip(attn.project(x, rope), attn.project(x, rope, qkv=f.attn_in[i])):
        assert (p - q).abs().max().item() < 1e-5


def test_pinning_fla_configs_sets_the_directories_fla_and_inductor_read(tmp_path, monkeypatch):
    """model.autotune.pin (what SHADOW_AUTOTUNE_DIR does before fla loads): fla's config dir
    and strict mode, inductor's cache under it unless the user named one."""
    import os
    import sys

    from adapters.model import autotune
    if "fla.ops.utils.cache" in sys.modules:
        pytest.skip("fla was imported unpinned in this process (test_autotune covers it)")
    for var in (autotune.ENV_DIR, autotune.ENV_MODE, "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert autotune.pinned_dir() is None and autotune.export(tmp_path) == 0   # fla not loaded
    path = autotune.pin(tmp_path / "picks")
    assert path.is_dir() and autotune.pinned_dir() == path
    assert (os.environ["FLA_CACHE_MODE"], os.environ["TORCHINDUCTOR_CACHE_DIR"]) == \
        ("strict", str(path / "inductor"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    autotune.pin(tmp_path / "picks")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"


def test_autotune_dir_defaults_to_the_cache_folder_and_can_be_turned_off():
    """model.autotune.env_dir: unset, empty or 'auto' pin fla's picks under the home cache
    folder (exact across processes by default), a path is taken as given, 'off' pins none."""
    from pathlib import Path

    from adapters.model import autotune
    default = Path("~/.cache/shadow-reader/autotune").expanduser()
    assert autotune.env_dir({}) == default
    assert autotune.env_dir({"SHADOW_AUTOTUNE_DIR": " auto "}) == default
    assert autotune.env_dir({"SHADOW_AUTOTUNE_DIR": ""}) == default
    assert autotune.env_dir({"SHADOW_AUTOTUNE_DIR": "/x/picks"}) == Path("/x/picks")
    assert autotune.env_dir({"SHADOW_AUTOTUNE_DIR": "~/p"}) == Path("~/p").expanduser()
    assert autotune.env_dir({"QWEN38_SHADOW_AUTOTUNE_DIR": "/q"}) == default   # not read
    assert autotune.env_dir({"SHADOW_AUTOTUNE_DIR": "OFF"}) is None


def test_an_autotune_dir_that_cannot_be_made_warns_for_the_default_and_names_a_chosen_one(
        tmp_path, monkeypatch):
    """A read-only home must not stop a model from loading: the default folder is skipped with
    a warning; a folder the user named is refused with a ValueError that names it."""
    from adapters.model import autotune
    blocker = tmp_path / "file"
    blocker.write_text("")                       # a file where a folder would go
    monkeypatch.setattr(autotune, "DEFAULT_DIR", blocker / "autotune")
    monkeypatch.delenv(autotune.ENV_DIR, raising=False)
    monkeypatch.delenv(autotune.ENV_MODE, raising=False)
    with pytest.warns(UserWarning, match="not pinned"):
        assert autotune.pin_from_env({}) is None
    with pytest.raises(ValueError, match="SHADOW_AUTOTUNE_DIR=.*cannot be made"):
        autotune.pin_from_env({"SHADOW_AUTOTUNE_DIR": str(blocker / "mine")})
    assert autotune.pin_from_env({"SHADOW_AUTOTUNE_DIR": "off"}) is None
    assert autotune.pinned_dir() is None


def test_runner_refuses_a_negative_position_and_takes_ids_as_a_tuple(tiny):
    """A negative pos would have the graphs' KV write land below the buffers: refused before
    anything runs; ids as a tuple read like the list."""
    from adapters.runners.graphs import ChunkGraphs
    runner, t = ChunkGraphs(tiny, 64), 64
    kv, gdn = _empty_kv(tiny.cfg, 2 * t), zero_gdn(spec_for(tiny.cfg, "cpu", torch.float32))
    with pytest.raises(ValueError, match="pos must be >= 0, got -64"):
        runner.run([5] * t, -t, kv, gdn)
    h1, _ = runner.run(tuple(range(t)), 0, kv, gdn)
    h2, _ = runner.run(list(range(t)), 0, kv, gdn)
    assert torch.equal(h1, h2)
