"""The identity that roots every page key covers what a chunk's bits depend on (issue 16, item
2): the device with its SM count, the kernels' package versions, and the autotuned kernel
picks the chunk's launches used (adapters.bits, adapters.model.picks).
fla is faked here (the CPU CI installs none): a stand-in for fla.ops.utils.cache whose
autotuner keeps one pick per key, as fla's CachedAutotuner does after tuning or loading."""
import hashlib
import json
import sys
import threading
import types

import pytest
import torch

from adapters import EagerAdapter, bits
from adapters.model import picks
from adapters.model.kernels import TORCH, KernelSet
from block_store.memory.keys import identity_key
from shadow_plugin import Reader

G = 64


class _Key:
    def __init__(self, key):
        self.autotune_key = key

    @classmethod
    def build(cls, arg_names, key_names, args, kwargs):
        """As fla's: the key arguments, then the dtype of every argument that has one."""
        named = {**dict(zip(arg_names, args)), **kwargs}
        key = [named[n] for n in key_names if n in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return cls(tuple(key))

    @staticmethod
    def key_hash(key) -> str:
        return hashlib.md5(json.dumps(list(key)).encode()).hexdigest()


class _Tuner:
    """One autotuned kernel: `run` keeps `pick` (its BK) for a key it has not seen, keyed as
    Triton's Autotuner keys its cache (the key arguments, then the tensors' dtypes)."""

    def __init__(self, name: str, pick: int):
        self.kernel_name, self.pick, self.cache = name, pick, {}
        self.arg_names, self.keys = ["x", "T", "H"], ["T", "H"]

    def run(self, *args, **kwargs):
        named = {**dict(zip(self.arg_names, args)), **kwargs}
        key = tuple([named["T"], named["H"], str(named["x"].dtype)])
        self.cache.setdefault(key, types.SimpleNamespace(
            kwargs={"BK": self.pick}, num_warps=4, num_stages=2, num_ctas=1, maxnreg=None))


class _Heuristics:
    """triton.heuristics over an autotuner: its run calls the autotuner's (fla's kernels)."""

    def __init__(self, fn):
        self.fn = fn

    def run(self, *args, **kwargs):
        return self.fn.run(*args, **kwargs)


X = torch.zeros(1, dtype=torch.bfloat16)


@pytest.fixture
def fake_fla(monkeypatch):
    module = types.ModuleType("fla.ops.utils.cache")
    module.CachedAutotuner, module.AutotuneKey = _Tuner, _Key
    monkeypatch.setitem(sys.modules, "fla.ops.utils.cache", module)
    return module


def _digest(tuner: _Tuner, *launches) -> str:
    with picks.recording() as used:
        for t, h in launches:
            _Heuristics(tuner).run(X, t, h)
    return picks.picks_digest(used)


def test_the_digest_covers_the_picks_of_the_launches_in_the_block_only(fake_fla):
    a, b = _Tuner("chunk_fwd_kernel_o", 64), _Tuner("chunk_bwd_other", 32)
    b.run(X, 512, 8)                                  # tuned before, never launched in the block
    d = _digest(a, (512, 8))
    assert len(d) == 16 and d != "none"
    b.cache.clear()
    b.pick = 16
    b.run(X, 512, 8)                                  # another pick of a kernel not launched
    assert _digest(a, (512, 8)) == d                  # a's pick is held: the same digest
    other = _Tuner("chunk_fwd_kernel_o", 32)          # the same kernel and key, another pick
    assert _digest(other, (512, 8)) != d
    assert _digest(_Tuner("chunk_fwd_kernel_o", 64), (512, 8)) == d   # another process's
    assert _digest(a, (512, 8), (512, 16)) != d       # one more launch, one more pick
    with picks.recording() as used:
        pass
    assert picks.picks_digest(used) == "none"


def test_recording_restores_the_autotuners_run_and_yields_nothing_without_fla(fake_fla,
                                                                              monkeypatch):
    run = _Tuner.run
    with pytest.raises(RuntimeError), picks.recording():
        raise RuntimeError("a failed warm-up")
    assert _Tuner.run is run
    monkeypatch.delitem(sys.modules, "fla.ops.utils.cache")
    with picks.recording() as used:
        _Tuner("k", 64).run(X, 512, 8)
    assert used == set() and picks.picks_digest(used) == "none"


def test_overlapping_recordings_in_two_threads_each_see_their_own_launches(fake_fla):
    """A recording in another thread, begun inside this one's and ended after it: each set
    holds its own thread's launches only, nested recordings both see theirs, and the class's
    run is the original once the last ends."""
    run = _Tuner.run
    a, b = _Tuner("kernel_a", 64), _Tuner("kernel_b", 32)
    started, finish, theirs = threading.Event(), threading.Event(), {}

    def other():
        with picks.recording() as used:
            started.set()
            finish.wait(10)
            _Heuristics(b).run(X, 256, 8)
        theirs["used"] = used
    with picks.recording() as outer:
        thread = threading.Thread(target=other)
        thread.start()
        started.wait(10)
        with picks.recording() as inner:
            _Heuristics(a).run(X, 512, 8)
        _Heuristics(a).run(X, 512, 16)
    assert _Tuner.run is not run                         # the other thread still records
    finish.set()
    thread.join(10)
    assert {(t.kernel_name, k[:2]) for t, k in inner} == {("kernel_a", (512, 8))}
    assert {(t.kernel_name, k[:2]) for t, k in outer} == {("kernel_a", (512, 8)),
                                                          ("kernel_a", (512, 16))}
    assert {(t.kernel_name, k[:2]) for t, k in theirs["used"]} == {("kernel_b", (256, 8))}
    assert _Tuner.run is run


def test_kernel_versions_name_fla_core_once_and_fla_switches():
    fla = KernelSet("fla", None, None, None)
    text = bits.kernel_versions(fla, env={"FLA_USE_FAST_OPS": "1"})
    assert "FLA_USE_FAST_OPS=1" in text and "FLA_TRIL_PRECISION=unset" in text
    assert text != bits.kernel_versions(fla, env={})
    assert text.count("fla-core") + text.count("flash-linear-attention") <= 1


def _fla_like(tuner: _Tuner) -> KernelSet:
    """TORCH's kernels under the name 'fla', each GDN call launching `tuner` as fla's would."""
    def gdn(q, k, v, g, beta, state):
        _Heuristics(tuner).run(q, q.shape[0], q.shape[1])
        return TORCH.gdn(q, k, v, g, beta, state)
    return KernelSet("fla", gdn, TORCH.conv, TORCH.gdn_step)


def test_the_kernel_picks_a_chunk_launched_enter_the_page_keys_root(tiny, fake_fla):
    ident = EagerAdapter(tiny, G, _fla_like(_Tuner("chunk_gdn", 64))).identity()
    same = EagerAdapter(tiny, G, _fla_like(_Tuner("chunk_gdn", 64))).identity()
    other = EagerAdapter(tiny, G, _fla_like(_Tuner("chunk_gdn", 32))).identity()
    assert ident.picks not in ("none", other.picks) and ident == same
    assert identity_key(ident.as_meta()) == identity_key(same.as_meta())
    assert identity_key(ident.as_meta()) != identity_key(other.as_meta())
    assert ident.as_meta()["picks"] == ident.picks
    assert ident.versions.startswith(f"torch {torch.__version__}")


def test_a_cpu_readers_identity_names_the_device_torch_and_no_picks(tiny):
    ident = Reader(tiny, grid=G).adapter.identity()
    assert (ident.device_kind, ident.picks) == ("cpu", "none")
    # no fla: triton and fla not named; the pure-torch kernels' revision (ref.REVISION) is
    assert ident.versions == f"torch {torch.__version__} ref 2"
    assert bits.kernel_versions(KernelSet("fla", None, None, None)).startswith(
        f"torch {torch.__version__}")
    assert set(ident.as_meta()) == {"fingerprint", "model_config", "grid", "dtype",
                                    "device_kind", "kernels", "versions", "picks"}






class _Caching:
    """As torch inductor's CachingAutotuner after its first launch: one launcher left, whose
    config is the pick."""

    def __init__(self, name: str, config: str):
        self.fn = types.SimpleNamespace(__name__=name)
        self.launchers = [types.SimpleNamespace(config=config)]

    def run(self, *args, stream=None, **kwargs):
        return None


def test_inductors_picks_enter_the_digest(monkeypatch):
    monkeypatch.setattr(picks, "_inductor", lambda: types.SimpleNamespace(
        CachingAutotuner=_Caching))
    monkeypatch.setattr(picks, "_fla", lambda: None)
    run = _Caching.run

    def digest(*kernels):
        with picks.recording() as used:
            for k in kernels:
                k.run(1, 2, stream=0)
        return picks.picks_digest(used)
    d = digest(_Caching("triton_per_fused_rms_norm_0", "XBLOCK: 1, RBLOCK: 1024"))
    assert d != "none" and _Caching.run is run
    assert digest(_Caching("triton_per_fused_rms_norm_0", "XBLOCK: 1, RBLOCK: 1024")) == d
    assert digest(_Caching("triton_per_fused_rms_norm_0", "XBLOCK: 1, RBLOCK: 512")) != d
    untuned = _Caching("triton_per_fused_rms_norm_0", "XBLOCK: 1, RBLOCK: 1024")
    untuned.launchers.append(types.SimpleNamespace(config="XBLOCK: 2, RBLOCK: 512"))
    assert digest(untuned) not in (d, "none")
