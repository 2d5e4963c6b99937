"""Pinning fla's autotuned kernel configs, so a state spilled by one process and read further by
another (or on another machine with the same GPU) meets the same kernels (issue 5).

fla's GDN kernels are autotuned per process (`chunk_fwd_kernel_o` may pick BK 64 or 32: another
split of a reduction, other bits). fla can load configs instead of tuning
(`fla.ops.utils.cache`: FLA_CONFIG_DIR holds `{kernel}.json`, FLA_CACHE_MODE=strict takes exact
key matches only and autotunes the rest). Here:

- `pin(path)`, before fla is imported (kernels.select_kernels does it with `env_dir()`: by
  default ~/.cache/shadow-reader/autotune, SHADOW_AUTOTUNE_DIR to name another, `off` for
  none): fla reads its configs from `path`;
- `export(path)`, after the runners' warm-up (runners.runners.Runners.prepare): every pick the
  autotuners hold is written to `path` in fla's own format, merged with what is there, so the
  next process loads them.

Measured on the H200 (evals/device/ab.sh, docs/two-process-2026-11-29.log): a state spilled
at 51,200 ids and read further by a second process started on empty Triton and inductor caches
(as on another machine) differed from a fresh prefill there (`layers.3.key`, 0.1055 against
0.1074) without the pin, and equalled it bit for bit with the pin.

Torch inductor tunes the compiled small ops too (a reduction's block sizes can change its
bits) and keeps its picks in its cache directory: `pin` points TORCHINDUCTOR_CACHE_DIR at
path/inductor unless the user set it, so processes sharing `path` share those picks as well.
FlashAttention-4's compiled kernels (attention.fa4) are kept in path/fa4 the same way: not for
the bits (the same code compiles to the same kernel) but for the minutes a new process would
spend compiling them.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from pathlib import Path

ENV_DIR, ENV_MODE = "FLA_CONFIG_DIR", "FLA_CACHE_MODE"
DEFAULT_DIR = Path("~/.cache/shadow-reader/autotune")
FA4_CACHE_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
FA4_CACHE_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"


def _raw(env=None) -> str:
    """SHADOW_AUTOTUNE_DIR as set, stripped; '' when unset."""
    env = os.environ if env is None else env
    return (env.get("SHADOW_AUTOTUNE_DIR") or "").strip()


def env_dir(env=None) -> Path | None:
    """Where to pin: SHADOW_AUTOTUNE_DIR as a path; unset, empty
    or `auto`: DEFAULT_DIR (under the home directory); `off`: None (each process tunes its
    own, and a state read on in another process may differ in bits)."""
    raw = _raw(env)
    if raw.lower() == "off":
        return None
    return (DEFAULT_DIR if raw.lower() in ("", "auto") else Path(raw)).expanduser()


def pin(path: str | os.PathLike) -> Path:
    """Make fla load its kernel configs from `path` (created), exact key matches only, and
    torch inductor keep its cache (tuned configs included) in path/inductor unless
    TORCHINDUCTOR_CACHE_DIR is set or `path` is not writable (a read-only copy shared with the
    session files: fla's picks are still loaded from it, inductor keeps its own cache).

    Raises OSError when `path` cannot be made, RuntimeError when fla is already imported with
    other settings (its mode is read once, at import)."""
    path = Path(path).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    cache = sys.modules.get("fla.ops.utils.cache")
    if cache is not None and (cache.FLA_CACHE_MODE.value != "strict"
                              or cache.get_fla_config_dir().resolve() != path):
        raise RuntimeError(f"fla was imported before its configs were pinned to {path} "
                           f"(mode {cache.FLA_CACHE_MODE.value}, dir {cache.get_fla_config_dir()})")
    os.environ[ENV_DIR], os.environ[ENV_MODE] = str(path), "strict"
    # torch.compile's own tuned configs (the small ops' reductions) are kept in its cache
    # directory next to the kernels; unless the user named one, it is the pinned one too
    if os.access(path, os.W_OK):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path / "inductor"))
        # FlashAttention-4 compiles its kernels at their first call in a process (the GPU
        # tests that first reached the split kinds took 100 and 123 s on the H200's host,
        # docs/tests-fa4-gpu-2026-11-29.log); its on-disk cache (off by default, read when
        # flash_attn.cute is imported) keeps them here too
        os.environ.setdefault(FA4_CACHE_ENABLED, "1")
        os.environ.setdefault(FA4_CACHE_DIR, str(path / "fa4"))
    return path


def pin_from_env(env=None) -> Path | None:
    """pin(env_dir(env)) before fla is imported (model.kernels). Where the default folder
    cannot be used (a read-only home, no home at all, fla imported before with other settings)
    a warning says so and nothing is pinned (each process then tunes its own picks); a folder
    the user named that cannot be made raises ValueError naming it (and RuntimeError from
    `pin` when fla was imported first)."""
    chosen = _raw(env).lower() not in ("", "auto")
    try:
        path = env_dir(env)
        return None if path is None else pin(path)
    except (OSError, RuntimeError) as e:
        if not chosen:
            warnings.warn(f"fla's kernel picks are not pinned ({e}); set SHADOW_AUTOTUNE_DIR "
                          f"to a writable folder (or 'off') for states that read on exactly "
                          f"in another process", stacklevel=2)
            return None
        if isinstance(e, OSError):
            raise ValueError(f"SHADOW_AUTOTUNE_DIR={str(path)!r} cannot be made: {e}") from None
        raise


def pinned_dir() -> Path | None:
    """The directory fla's configs are pinned to in this process, or None."""
    if os.environ.get(ENV_MODE) != "strict" or not os.environ.get(ENV_DIR):
        return None
    return Path(os.environ[ENV_DIR])


def autotuners() -> list:
    """Every fla autotuner in the loaded fla modules (unwrapped from triton.heuristics)."""
    cache = sys.modules.get("fla.ops.utils.cache")
    if cache is None:
        return []
    found = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:
            continue
        for value in list(vars(module).values()):
            for _ in range(8):                         # Heuristics -> ... -> the autotuner
                if isinstance(value, cache.CachedAutotuner) or not hasattr(value, "fn"):
                    break
                value = value.fn
            if isinstance(value, cache.CachedAutotuner):
                found[id(value)] = value
    return list(found.values())


def _entry(key: tuple, config) -> dict:
    """One autotune entry in fla's format: the key and the config's launch parameters."""
    return {"autotune_key": list(key),
            "config": {"kwargs": dict(config.kwargs), "num_warps": config.num_warps,
                       "num_stages": config.num_stages, "num_ctas": config.num_ctas,
                       "maxnreg": config.maxnreg}}


def export(path: str | os.PathLike) -> int:
    """Write every pick the fla autotuners hold into path/{kernel}.json (fla's format, entries
    keyed by fla's own key hash, merged with the file's under a lock, a pick already there
    winning; a file that holds every key already is left as it is). Returns the number of picks
    held (0 when fla is not loaded). A folder or file that cannot be written warns."""
    cache = sys.modules.get("fla.ops.utils.cache")
    if cache is None:
        return 0
    import triton
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        warnings.warn(f"fla's picks not written: {path} cannot be made ({e})", stacklevel=2)
        return 0
    by_kernel: dict[str, dict] = {}
    for tuner in autotuners():
        for key, config in tuner.cache.items():
            by_kernel.setdefault(tuner.kernel_name, {})[
                cache.AutotuneKey.key_hash(key)] = _entry(key, config)
    with _locked(path):                                # processes sharing the folder merge
        for kernel, entries in by_kernel.items():
            _merge(path / f"{kernel}.json", kernel, entries, triton.__version__)
    return sum(len(e) for e in by_kernel.values())


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on path/.lock while held (POSIX; elsewhere, or on a read-only folder,
    no lock: the writes stay atomic, a concurrent merge may drop the other's new picks)."""
    try:
        import fcntl
        fd = os.open(path / ".lock", os.O_CREAT | os.O_RDWR)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                                   # closing releases the lock


def _merge(file: Path, kernel: str, entries: dict, triton_version: str) -> None:
    """Add entries to one kernel's file; a pick already there wins (every process that shares
    the folder keeps the first pick made for a key). Failed writes warn."""
    try:
        old = json.loads(file.read_text()).get("autotune_entries", {}) if file.exists() else {}
    except (OSError, ValueError, AttributeError):
        old = {}                                       # unreadable: rewritten whole
    if all(h in old for h in entries):
        return                                         # every runner's warm-up asks: no news
    doc = {"kernel_name": kernel, "triton_version": triton_version,
           "autotune_entries": {**entries, **old}}
    tmp = file.with_suffix(f".json.{os.getpid()}.tmp")  # one per process: no torn writes
    try:
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        tmp.replace(file)                              # readers never see half a file
    except OSError as e:                               # a full or read-only disk: not fatal
        warnings.warn(f"fla's picks for {kernel} not written to {file.parent}: {e}",
                      stacklevel=3)
