"""The autotuned kernel picks a chunk's bits depend on, for the page keys' identity
(adapters.interface.Adapter.kernel_picks).

Two autotuners choose kernels by timing them, so two processes may pick differently and get
other bits from the same ids: fla's GDN kernels (fla.ops.utils.cache.CachedAutotuner: one
config per key, in its `cache`; model.autotune pins them in a shared folder) and torch
inductor's compiled small ops (torch._inductor.runtime.triton_heuristics.CachingAutotuner:
after its first launch, one launcher whose config is the pick; shared through inductor's
cache folder). `recording` notes which of them a block of code launched (a runner's warm-up)
and `picks_digest` digests their picks, so processes with the same picks share pages and
processes with others do not.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
import threading

import xxhash

# The recordings in progress, by thread. Process-wide by necessity: the wrappers sit on the
# autotuners' classes, which every thread's launches go through; one lock installs them with
# the first recording and removes them with the last, so overlapping recordings in several
# threads neither lose launches nor leave a class patched.
_LOCK = threading.Lock()
_RECORDERS: dict[int, list[set]] = {}
_ORIGINALS: dict[type, object] = {}       # each wrapped class's own run while wrapped


def _fla():
    return sys.modules.get("fla.ops.utils.cache")


def _inductor():
    """torch inductor's runtime autotuner module where triton is installed (CUDA), or None."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import torch._inductor.runtime.triton_heuristics as heuristics
    except Exception:                      # another torch layout: its picks go unrecorded
        return None
    return heuristics


def _targets() -> list[tuple[type, object]]:
    """(autotuner class, its launch's key function (self, args, kwargs) -> key) for each
    autotuner loaded: fla's keyed as fla keys its cache, inductor's None (one pick)."""
    out = []
    fla, inductor = _fla(), _inductor()
    if fla is not None:
        out.append((fla.CachedAutotuner, lambda self, args, kwargs: fla.AutotuneKey.build(
            self.arg_names, self.keys, args, kwargs).autotune_key))
    if inductor is not None and hasattr(inductor, "CachingAutotuner"):
        out.append((inductor.CachingAutotuner, lambda self, args, kwargs: None))
    return out


@contextlib.contextmanager
def recording():
    """Within the block, every launch this thread makes through an autotuner (fla's
    CachedAutotuner.run, also through a triton.heuristics wrapper; inductor's
    CachingAutotuner.run) is recorded: yields a set that fills with (autotuner, key) pairs
    (key None for inductor's). Other threads' launches are not recorded. Recordings may
    overlap, in one thread or several. Yields an empty set when neither is loaded."""
    used: set = set()
    me = threading.get_ident()
    with _LOCK:
        if not _ORIGINALS:
            for cls, key_of in _targets():
                _wrap(cls, key_of)
        _RECORDERS.setdefault(me, []).append(used)
    try:
        yield used
    finally:
        with _LOCK:
            mine = _RECORDERS[me]
            del mine[next(i for i, u in enumerate(mine) if u is used)]   # sets compare equal
            if not mine:
                del _RECORDERS[me]
            if not _RECORDERS:
                for cls, run in _ORIGINALS.items():
                    cls.run = run
                _ORIGINALS.clear()


def _wrap(cls: type, key_of) -> None:
    """Wrap cls.run (under _LOCK): after each launch, (the autotuner, its key) goes into
    every set the launching thread is recording into."""
    original = _ORIGINALS[cls] = cls.run

    def run(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        sets = _RECORDERS.get(threading.get_ident())
        if sets:
            entry = (self, key_of(self, args, kwargs))
            for used in sets:
                used.add(entry)
        return out

    cls.run = run


def picks_digest(used) -> str:
    """xxh3-64 hex digest of the picks for the launches in `used` (pairs from `recording`),
    in sorted order: fla's as (kernel name, fla's key hash, the config's launch parameters),
    inductor's as (kernel name, '', the config of its one launcher). Two processes whose
    chunks launched with the same picks get the same digest, whatever else they tuned.
    'none' for no pick."""
    entries = sorted(e for e in (_entry(tuner, key) for tuner, key in used) if e is not None)
    if not entries:
        return "none"
    return xxhash.xxh3_64(json.dumps(entries).encode()).hexdigest()


def _entry(tuner, key) -> tuple[str, str, str] | None:
    if key is None:                                    # inductor's: its one launcher
        launchers = getattr(tuner, "launchers", None) or []
        config = str(launchers[0].config) if len(launchers) == 1 else f"{len(launchers)} left"
        return (f"inductor {getattr(tuner.fn, '__name__', '?')}", "", config)
    fla = _fla()
    if fla is None or key not in tuner.cache:
        return None
    c = tuner.cache[key]
    config = {"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages,
              "num_ctas": c.num_ctas, "maxnreg": c.maxnreg}
    return (tuner.kernel_name, fla.AutotuneKey.key_hash(key),
            json.dumps(config, sort_keys=True, default=str))
