"""Attention of a chunk over a sequence's KV pages through FlashAttention-4's CuTe DSL kernels
(the `flash-attn-4` package, `flash_attn.cute`), called eagerly between the CUDA graphs of a
chunk (attention "fa4": `FA4Attention.attend`, one object per runner); the pure-torch twin is
`ref.attend_ref` over the gathered rows.

Pages: the pools [num_pages, G, Hkv, D] are read as sub-pages of SUB_PAGE = 64 rows (the same
memory) through the package's `page_table` (int32), with a 64-row key tile (`tile_mn` (128,
64)): its SM90 paged path loads by TMA only when the page size equals the key tile; 512-row
pages on the other path cost +9-11 % a layer, 64-row sub-pages with the 64-row tile +4-6 %
(../shared/notes/fa4-paged-attention.md, measured 2026-12-01). With one tile, paged bits equal
contiguous bits whatever the page order (same note), so bits never depend on where a page
lies. The tables for a run (`plan`) are built once on the host for all layers.

Why: on Hopper (SM90) that package's forward is FlashAttention-3's design (wgmma, TMA loads, a
producer warp group feeding two consumer warp groups; Shah et al. 2024) and takes head_dim 256,
where FlashAttention-2 (what torch ships) runs at about 265 TFLOP/s for a 512-id chunk of
random:qwen3.5-0.8b at 16k context on the H200 (BENCHMARKS.md, the profile of 2026-11-29), 39 %
of the chunk. Query heads of one KV group are packed into the rows of one tile (pack_gqa).

Its SM90 forward does not split the keys (flash-attn-4 4.0.0b36 refuses num_splits > 1 there),
and one 512-id chunk is only 32 tiles of 128 rows (T * G / 128 per KV head) for 132 SMs. So the
keys are split here: the S * Ls keys before the chunk that every row sees go in as a batch of S
sequences of Ls keys (the chunk's queries repeated S times, no mask), the rest [S * Ls, pos + T)
in one causal call (bottom-right aligned), and the S + 1 partial outputs are merged by their
log-sum-exp (`combine`, twin `combine_ref`; flash-decoding, Dao et al. 2023). S and Ls are a
function of (pos, T, the head shapes, the GPU's SM count) only (`split_plan`), so the bits are a
function of (pos, T, values), never of the buffer's capacity.
The kernels are compiled at their first call in a process (CuTe DSL JIT, seconds each; cached on
disk when FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1).
"""
from __future__ import annotations

import functools
import os

import numpy as np
import torch

from adapters.attention import fa4_plan
from adapters.attention.fa4_plan import (  # noqa: F401
    MAX_SPLITS,
    MIN_SPLIT_KEYS,
    SUB_PAGE,
    TILE_M,
    TILE_MN,
    Plan,
    all_sub_pages,
    plan_into,
    plan_size,
    split_plan,
    sub_pages,
)
from adapters.attention.fa4_record import record as _record

# the package versions whose SM90 call pattern fa4_record.record was checked against
# (interface.py's _flash_attn_fwd: the tensors, then constants that do not depend on the
# shapes); others stay on the package's path (slower, same bits)
DIRECT_VERSIONS = ("4.0.0b36",)


@functools.lru_cache(maxsize=None)
def _forward():
    """The package's forward entry (flash_attn.cute.interface._flash_attn_fwd: it takes `out`
    and `lse`, which the public flash_attn_func does not), or None when it does not import."""
    try:
        from flash_attn.cute.interface import _flash_attn_fwd
    except Exception:                     # not installed, or its CUDA libraries do not load
        return None
    return _flash_attn_fwd


def forward():
    """flash_attn.cute.interface._flash_attn_fwd. Raises RuntimeError when it does not
    import."""
    fwd = _forward()
    if fwd is None:
        raise RuntimeError("attention 'fa4' needs the flash-attn-4 package (flash_attn.cute)")
    return fwd


def package_version() -> str:
    """flash-attn-4's version and its compiler's (nvidia-cutlass-dsl), 'flash-attn-4 missing'
    without it: both decide the kernels' bits (the path tag carries this)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        fa4 = version("flash-attn-4")
    except PackageNotFoundError:
        return "flash-attn-4 missing"
    try:
        return f"{fa4} cute-dsl {version('nvidia-cutlass-dsl')}"
    except PackageNotFoundError:
        return fa4


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where the FA4 forward can run: a Hopper GPU (compute capability 9.x, the kernels
    this module was measured with), fp16 or bf16, flash_attn.cute importable, and the package
    choosing kernels for this GPU (it reads the current device's capability, or
    FLASH_ATTENTION_ARCH)."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9 or torch.cuda.get_device_capability() != (major, minor):
        return False
    arch = os.environ.get("FLASH_ATTENTION_ARCH", "").lower().removeprefix("sm_").rstrip("a")
    if arch and arch != f"{major}{minor}":
        return False
    return _forward() is not None


def _check(q, pos: int, k_pool, v_pool, plan: Plan, out) -> None:
    """ValueError naming what does not fit `FA4Attention.attend`'s contract."""
    t, h, d = q.shape
    _, g, hkv, dk = k_pool.shape
    problems = []
    if (plan.pos, plan.t) != (pos, t) or v_pool.shape != k_pool.shape or g % SUB_PAGE:
        problems.append(f"a plan for ({plan.pos}, {plan.t}) used at ({pos}, {t}), pools "
                        f"{tuple(k_pool.shape)} / {tuple(v_pool.shape)}")
    if dk != d or h % hkv or out.shape != (t, h * d) or not out.is_contiguous():
        problems.append(f"shapes q {tuple(q.shape)}, KV rows [{hkv}, {dk}], out "
                        f"{tuple(out.shape)} (contiguous: {out.is_contiguous()})")
    if len({q.dtype, k_pool.dtype, v_pool.dtype, out.dtype}) != 1:
        problems.append(f"dtypes {q.dtype}, {k_pool.dtype}, {v_pool.dtype}, {out.dtype}")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        problems.append("KV pools not contiguous")
    if problems:
        raise ValueError("fa4.attend: " + "; ".join(problems))


class FA4Attention:
    """`attend` for one runner (ChunkGraphs), with what it learns between calls: the package's
    compiled kernels, called directly once seen.

    Why: the package's Python around a kernel (checks, config, compile-key building) costs the
    host about 0.1 ms a call on the H200's host (evals/fa4_probe.py at cadb457, `fa4_one_call`
    host_ms), two calls a layer here, six layers a chunk. The first call of each kind (see
    `_fwd`) goes through `_flash_attn_fwd`; while it runs, its compile cache is watched and the
    one compiled kernel it calls, with its arguments, is kept (`fa4_record.record`). Later calls
    of that kind call the kernel with the new q, k, v, out and lse in the places where those
    tensors were. Same kernel, same arguments: the same bits (tested: the direct calls equal the
    package's own). A call that does not fit that pattern (no kernel seen, or a tensor argument
    not ours, a package version not in DIRECT_VERSIONS) is never taken directly. The recorded
    arguments keep no tensor: each direct call fills a fresh copy.

    Single-token decode does not come here: the decode runner reads pages with the table
    attention (runners.runners; FA4 wastes a 128-row tile on one row: 3x slower at 100k,
    evals/fa4_probe.py at cadb457).

    On CUDA the splits' call runs on a stream of the highest priority while the causal tail
    runs on the caller's (`overlap`): the splits take S * tiles <= the SM count (`split_plan`,
    one tile an SM), so the tail's tiles fill the SMs left and those the splits free, instead
    of running after them. The same kernels on the same inputs: the same bits. The priority
    ranks the splits above this process's other streams only: inside a serving engine's
    process the shadow's chunks run between the engine's steps, or in the per-step slot with
    the device synchronised before and after (shadow_plugin.engine.turnstile,
    shadow_plugin.scheduling.host); another process's kernels time-share the GPU with ours
    (without MPS).

    Args: num_heads (H), num_kv_heads (Hkv): the heads every call has (the splits depend on
    them); overlap: the splits and the tail on two streams (CUDA only; default on)."""

    def __init__(self, num_heads: int, num_kv_heads: int, overlap: bool = True):
        self._heads = (num_heads, num_kv_heads)
        self._direct: dict = {}          # kind (see _fwd) -> (kernel, args, slots) or None
        self.num_direct_calls = 0
        self.overlap = overlap
        self._streams: dict = {}         # device index -> (stream, event before, event after)

    def warm_up(self, t: int, head_dim: int, page_rows: int, device: torch.device,
                dtype: torch.dtype) -> None:
        """Compile and record each kind of call a runner of t rows makes, before its first
        real chunk (a kernel's first compile takes seconds): at pos 0 (one causal call) and,
        where t rows are split, at pos 2 * MIN_SPLIT_KEYS (the splits and the causal tail),
        over pools of pages of page_rows rows in reverse order."""
        pos = 2 * fa4_plan.MIN_SPLIT_KEYS        # read at call time (tests lower it)
        n = -(-(pos + t) // page_rows)
        g = torch.Generator(device=device).manual_seed(0)
        num_heads, num_kv_heads = self._heads
        k, v = (torch.randn(n, page_rows, num_kv_heads, head_dim, device=device, generator=g)
                .to(dtype) for _ in "kv")
        q = torch.randn(t, num_heads, head_dim, device=device, generator=g).to(dtype)
        out = torch.empty(t, num_heads * head_dim, device=device, dtype=dtype)
        pages = list(range(n))[::-1]
        for at in (0, pos):
            self.attend(q, at, k, v, self.plan(at, t, pages, page_rows, device), out)

    def num_splits(self, pos: int, t: int, device: torch.device) -> int:
        """S of split_plan for a run of t rows at pos with this object's heads on device's
        GPU (its SM count)."""
        return split_plan(pos, t, *self._heads, _num_sms(device.index or 0))[0]

    def split_keys(self, pos: int, t: int, device: torch.device) -> int:
        """S * Ls of split_plan for a run of t rows at pos on device's GPU: the keys before
        the run that its splits read (rows [0, S Ls)); 0 without splits."""
        s, ls = split_plan(pos, t, *self._heads, _num_sms(device.index or 0))
        return s * ls

    def all_splits(self, t: int, device: torch.device) -> list[int]:
        """fa4_plan.all_splits for this object's heads on device's GPU."""
        return fa4_plan.all_splits(t, *self._heads, _num_sms(device.index or 0))

    def plan(self, pos: int, t: int, pages, page_rows: int, device: torch.device) -> Plan:
        """The page tables of a run at `pos` of t rows over `pages` (page indices in row order,
        pools of page_rows rows), for every layer's `attend`, in a tensor of their own (runners
        stage them with their other inputs instead: `plan_into`). Raises ValueError when pos
        or pos + t is not a multiple of SUB_PAGE (what the sub-page tables cover)."""
        host = np.empty(plan_size(pos + t, page_rows), dtype=np.int32)
        dev = torch.empty(host.shape, dtype=torch.int32, device=device)
        out, used = self.plan_into(pos, t, np.asarray(pages, dtype=np.int64), page_rows, host,
                                   dev)
        dev[:used].copy_(torch.from_numpy(host[:used]))
        return out

    def plan_into(self, pos: int, t: int, pages: np.ndarray, page_rows: int, host: np.ndarray,
                  dev: torch.Tensor) -> tuple[Plan, int]:
        """fa4_plan.plan_into for this object's heads and the device's SM count."""
        fa4_plan.check_rows(pos, t)             # before the device is asked anything
        return plan_into(pos, t, self._heads, _num_sms(dev.device.index or 0), pages, page_rows,
                         host, dev)

    def attend(self, q: torch.Tensor, pos: int, k_pool: torch.Tensor, v_pool: torch.Tensor,
               plan: Plan, out: torch.Tensor) -> None:
        """Write to out [T, H * D] (contiguous) the causal attention (bottom-right aligned,
        scale D^-0.5) of q [T, H, D] at positions [pos, pos + T) over sequence rows
        [0, pos + T) of the pools k_pool, v_pool [num_pages, G, Hkv, D] (contiguous, the
        chunk's own rows already written) in the pages `plan` was made for (`plan`, at this
        pos and T). All in the pools' dtype (fp16/bf16, CUDA). Raises ValueError for inputs
        that do not fit that (checked before any kernel runs), RuntimeError when
        flash_attn.cute is missing, and, at the first call of a kind, the package's
        AssertionError for shapes it does not take (D > 256, say)."""
        t, h, d = q.shape
        hkv = k_pool.shape[2]
        _check(q, pos, k_pool, v_pool, plan, out)
        k = k_pool.view(-1, SUB_PAGE, hkv, d)
        v = v_pool.view(-1, SUB_PAGE, hkv, d)
        q = q.contiguous()
        s, _ = plan.splits
        if s == 0:
            self._fwd(q[None], k, v, plan.tail, True, out.view(1, t, h, d), None)
            return
        o_part = torch.empty(s + 1, t, h, d, device=q.device, dtype=q.dtype)
        lse_part = torch.empty(s + 1, h, t, device=q.device, dtype=torch.float32)
        qs = q[None].expand(s, t, h, d)    # S copies as a stride-0 view (FA4 reads it so)
        split = lambda: self._fwd(qs, k, v, plan.split, False, o_part[:s], lse_part[:s])  # noqa
        tail = lambda: self._fwd(q[None], k, v, plan.tail, True, o_part[s:], lse_part[s:])  # noqa
        if self.overlap and q.is_cuda:
            # the caller's stream waits for the splits before the combine, also when the tail
            # raises, and the tensors the splits read or write are freed after that wait: no
            # work on the caller's stream reuses them before the splits are done
            side, before, after = self._side(q.device)
            caller = torch.cuda.current_stream(q.device)
            before.record(caller)
            side.wait_event(before)
            with torch.cuda.stream(side):
                split()
                after.record(side)
            try:
                tail()
            finally:
                caller.wait_event(after)
        else:
            split()
            tail()
        from adapters.attention.combine import combine_lse
        combine_lse(o_part, lse_part, out)

    def split_stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream the splits run on beside the caller's (`_side`'s, made at its first use
        on `device`): what a runner that calls FA4 inside its own graph (runners.fa4_graph)
        forks its splits onto."""
        return self._side(device)[0]

    def _side(self, device: torch.device) -> tuple:
        """(stream of the highest priority, an event for the caller's stream, one for it) on
        `device`, made at its first use there."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._streams:
            with torch.cuda.device(index):
                self._streams[index] = (torch.cuda.Stream(priority=-100), torch.cuda.Event(),
                                        torch.cuda.Event())
        return self._streams[index]

    def _fwd(self, q, k, v, page_table, causal: bool, out, lse) -> None:
        """One FA4 forward over pages, q [B, T, H, D], k, v [num_sub_pages, SUB_PAGE, Hkv, D],
        page_table [B, n] int32 -> out [B, T, H, D] (and lse [B, H, T] fp32 when given):
        directly when this kind (causal, lse, dtype, T, H, D, Hkv: what the package's choice
        of kernel can depend on; B, n and the pool's pages cannot) was recorded, else through
        the package (recording it)."""
        key = (causal, lse is not None, q.dtype, tuple(q.shape[1:]), k.shape[2])
        entry = self._direct.get(key, False)
        if entry:
            kernel, template, slots = entry
            args = list(template)            # a fresh list: no tensor outlives its call here
            for i, x in zip(slots, (q, k, v, page_table, out, lse)):
                args[i] = x
            kernel(*args)
            self.num_direct_calls += 1
            return
        call = functools.partial(forward(), page_table=page_table, causal=causal, tile_mn=TILE_MN,
                                 out=out, lse=lse)
        if entry is None or package_version().split()[0] not in DIRECT_VERSIONS:
            call(q, k, v)                     # seen, not fit for direct calls
            self._direct[key] = None
            return
        self._direct[key] = _record(call, q, k, v, page_table, out, lse)
