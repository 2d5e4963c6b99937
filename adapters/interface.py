"""The one interface the reader calls for every forward: the forward at page granularity.

An adapter runs Qwen3.5 over state it is handed (block_store's layouts, `spec`):
- `read_chunk`: one grid chunk of exactly `grid` ids at `pos` (what commits state);
- `fork_logits`: a fork's ids above C (a question), logits of the last id only;
- `decode`: a fork's prompt above C, then up to n tokens greedily, stopping at a stop id;
- `read_chunks`, `fork_logits_batch`: several of those, of other sequences, at once, each with
  the bits it gets alone (by default one at a time; the eager adapters run them in one
  forward, Qwen35.forward_batch, where the machine's GEMMs allow it).
KV rows at and above `pos` are written into the pages given (a block_store.PagedKv: the pool's
pages [num_pages, G, Hkv, D] per attention layer and a sequence's page table); GDN states are
returned new, never changed in place. `path` names what the bits depend on beyond the weights
(spilled
files carry it); the reader never asks which implementation it holds.

Implementations: adapters.graphed.GraphAdapter (the CUDA-graph runners; their bodies run
eagerly on the CPU), adapters.eager.EagerAdapter (Qwen35.forward with the model's kernel set)
and adapters.eager.ReferenceAdapter (the pure-torch kernels on any device: the CPU path and
the oracle). adapters.select.make_adapter picks one.
"""
from __future__ import annotations

import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adapters import bits
from adapters.model import picks
from adapters.model.config import ModelConfig, spec_for  # noqa: F401  (spec_for: re-exported)
from adapters.model.kernels import KernelSet
from adapters.model.qwen35 import ModelInfo, Qwen35
from block_store import FileIdentity, PagedKv, StateSpec, contiguous_kv
from block_store.memory.layout import GdnState, zero_gdn

# Forwards of a fork start at multiples of ROW_ALIGN rows: FA4 reads the pools in sub-pages of
# 64 rows (attention.fa4_plan.SUB_PAGE) and fla's GDN kernels work in 64-row chunks; a
# question's tail ids[line:cut] is cut there (cut = at // ROW_ALIGN * ROW_ALIGN).
ROW_ALIGN = 64


def check_rows(num_ids: int, pos: int, grid: int) -> None:
    """ValueError unless num_ids is a positive multiple of ROW_ALIGN below `grid` and pos an
    int, a multiple of ROW_ALIGN (what Adapter.read_rows takes)."""
    if num_ids <= 0 or num_ids % ROW_ALIGN or num_ids >= grid or isinstance(pos, bool) or \
            not isinstance(pos, int) or pos < 0 or pos % ROW_ALIGN:
        raise ValueError(f"read_rows takes a positive multiple of {ROW_ALIGN} ids below the "
                         f"grid ({grid}) at a multiple of {ROW_ALIGN}; got {num_ids} ids at "
                         f"{pos}")


def state_spec(model: Qwen35) -> StateSpec:
    """spec_for the model's config, device and dtype."""
    return spec_for(model.cfg, model.device, model.dtype)


@dataclass(frozen=True)
class Decoded:
    """ids: the greedy continuation (ending with a stop id when one came); num_steps: one-token
    forwards run (those past a stop id seen late included); prefill_ms: wall time of the
    prompt's forward and the first token; decode_ms: wall time of the steps after it."""

    ids: tuple[int, ...]
    num_steps: int
    prefill_ms: float
    decode_ms: float


class Adapter(ABC):
    """Qwen3.5 (`model`, an adapters.model.Qwen35) read in chunks of `grid` ids.

    Facts the reader needs: spec (block_store.StateSpec), vocab_size, max_positions, info
    (ModelInfo: name, fingerprint, random or not), path, identity() (what spilled files must
    match)."""

    def __init__(self, model: Qwen35, grid: int):
        self.model, self.grid = model, grid
        self.spec = state_spec(model)
        # read_chunks calls that ran as one forward over two or more chunks, and their chunks
        # (a batch read one at a time counts in neither)
        self.num_batched_forwards = self.num_batched_chunks = 0

    # -- facts ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    @property
    def max_positions(self) -> int:
        """The model's max_position_embeddings (positions past it are read, and flagged)."""
        return self.model.cfg.max_position_embeddings

    @property
    def info(self) -> ModelInfo:
        return self.model.info

    @property
    def kernels(self) -> KernelSet:
        """The GDN kernel set the forwards use."""
        return self.model.kernels

    @property
    @abstractmethod
    def path(self) -> str:
        """How chunks are read, e.g. 'eager' or 'graphs:fa4 ...+fused+proj': the committed
        bits depend on it."""

    def identity(self) -> FileIdentity:
        """What a spilled file must match to be loaded, and the root of every page key:
        weights' fingerprint, model config, grid, dtype, device kind ('cpu' or 'cuda:<GPU
        name> <N> SMs'), kernels and path, the kernels' package versions, and the digest of
        the autotuned kernel picks (`kernel_picks`: on CUDA with fla this warms the chunk
        runner up first). adapters.bits says why each."""
        dtype = str(self.model.dtype).removeprefix("torch.")
        return FileIdentity(self.info.fingerprint,
                            json.dumps(self.model.cfg.to_dict(), sort_keys=True), self.grid,
                            dtype, bits.device_kind(self.model.device),
                            f"{self.kernels.name} {self.path}",
                            bits.kernel_versions(self.kernels), self.kernel_picks())

    def kernel_picks(self) -> str:
        """Digest of the autotuned kernel picks a grid chunk's bits depend on
        (model.picks.picks_digest), 'none' for a kernel set without autotuned kernels.
        Runs one grid chunk over state of its own (at pos 0, its ids all 0) and digests the
        picks of the launches it made; a subclass with a warm-up of its own overrides this."""
        if self.kernels.name != "fla":
            return "none"
        kv = contiguous_kv(self.spec, self.grid, self.grid)
        with self.on_device(), torch.no_grad(), picks.recording() as used:
            self.read_chunk([0] * self.grid, 0, kv, zero_gdn(self.spec))
        return picks.picks_digest(used)

    def on_device(self):
        """A context in which the calling thread's current CUDA device is the adapter's, the
        thread's own restored after it (a reader built in an engine's thread, whose device
        may be another; bind_thread sets it for good); nothing on the CPU."""
        dev = self.model.device
        return torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()

    def sync(self) -> None:
        """Wait for the device (CUDA) to finish what was queued."""
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)

    def bind_thread(self) -> None:
        """Make the calling thread's current CUDA device the adapter's: graphs are captured
        and some kernels launch on the current device, which a new thread starts at cuda:0
        (an engine's worker on another GPU would otherwise get the shadow's work there)."""
        if self.model.device.type == "cuda":
            torch.cuda.set_device(self.model.device)

    def graph_stats(self) -> dict:
        """What the forwards' CUDA graphs hold: {} without graphs (this default); a graph
        adapter's counts (runners.Runners.captures)."""
        return {}

    def prepare(self, pool=None, kept_rows: Sequence[int] = (),
                chunk_batches: Sequence[int] = ()) -> None:
        """Compile and capture now what the first forwards would (nothing by default). pool:
        the reader's block_store.KvPool, for graphs that name the pool they read (FA4 inside
        a chunk's graph), or None; kept_rows: row counts of `read_rows` forwards to prepare
        too (a fork's tails); chunk_batches: numbers of chunks of `read_chunks` batches to
        prepare too (a scheduler that reads several sessions' chunks in one forward)."""

    # -- forwards -------------------------------------------------------------------------------
    @abstractmethod
    def read_chunk(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        """Forward exactly `grid` ids at absolute positions [pos, pos + grid): writes KV rows
        [pos, pos + grid) of the sequence `kv` (its pages hold rows >= pos + grid, rows
        [0, pos) the prefix); returns the GDN states after the chunk
        (per GDN layer (conv [conv_dim, W], recurrent [HV, K, V] fp32)); `gdn` is not changed."""

    @abstractmethod
    def read_rows(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState) -> GdnState:
        """Forward a fork's piece that keeps its states: len(ids) ids, a positive multiple of
        ROW_ALIGN below the grid, at pos, a multiple of ROW_ALIGN (a question's tail past the
        grid line, ids[line:cut], kept by the reader; the piece from there up to the next
        grid line). Writes KV rows [pos, pos + len(ids)) of `kv` and returns the GDN states
        after the last id (per GDN layer (conv [conv_dim, W] model dtype, recurrent
        [HV, K, V] fp32), new tensors; `gdn` is not changed). Raises ValueError for a length
        or pos off ROW_ALIGN (check_rows)."""

    def batches(self, lengths: Sequence[int] | None = None,
                positions: Sequence[int] | None = None,
                shared_rows: int | None = None) -> bool:
        """Whether read_chunks and fork_logits_batch run a batch in one forward (False: one at
        a time, this default; a caller that must bound how long it holds the device then
        hands them one item at a time). lengths: the ids of each item of the batch to be run
        (None: whether this adapter batches at all); positions: the questions' positions, for
        an adapter whose one forward holds one position's questions (the graph adapter's:
        False for several), or None; shared_rows: the KV rows [0, n) the questions hold the
        same (fork.shared_rows), for an adapter whose one forward reads them once for all
        (the graph adapter's FA4: False where its splits would read past them), or None."""
        return False

    def read_chunks(self, items: Sequence[tuple[Sequence[int], int, PagedKv, GdnState]]
                    ) -> list[GdnState]:
        """read_chunk for each item (ids, pos, kv, gdn), in order: grid chunks of several
        sequences (no two writing one page), each with the bits read_chunk gives it alone, so
        a state read in a batch is the state read alone (the same `path`). Returns the GDN
        states after each chunk. By default one at a time; `chunk_group` says which chunks
        an adapter reads in one forward."""
        return [self.read_chunk(*item) for item in items]

    def chunk_group(self, positions: Sequence[int]) -> list[int]:
        """The indices of the grid chunks at `positions` (one per session, in order) that one
        read_chunks forward takes with the first (Reader.read_batch reads those, so a call
        holds the device for one forward): all where `batches` says chunks of the grid batch,
        else the first alone ([] for none)."""
        n = len(positions)
        return list(range(n)) if n > 1 and self.batches([self.grid] * n) else [0][:n]

    def fork_logits_batch(self, items: Sequence[tuple[Sequence[int], int, PagedKv, GdnState,
                                                      Sequence[int]]],
                          shared_rows: int = 0) -> list[torch.Tensor]:
        """fork_logits for each item (ids, pos, kv, gdn, token_ids), in order: forks of one
        session or several (no two writing one page), each with the logits fork_logits gives
        it alone ([len(token_ids)] fp32 each). shared_rows: every item's KV holds the same
        rows [0, shared_rows) (forks of one session's state: the same pages wholly below it,
        and the page it ends in the same or a copy of one page), which a batch may read once
        for all (0: nothing shared). By default one at a time."""
        return [self.fork_logits(*item) for item in items]

    def fork_rows(self, num_ids: int) -> int:
        """KV rows at and above pos that a fork_logits of num_ids ids writes (>= num_ids: a
        runner may pad to its bucket)."""
        return num_ids

    @abstractmethod
    def fork_logits(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState,
                    token_ids: Sequence[int]) -> torch.Tensor:
        """Forward `ids` at pos (rows [pos, pos + fork_rows(len(ids))) are scratch) and return
        the logits of the last id for `token_ids` only: [len(token_ids)] fp32. GDN states
        produced are dropped."""

    def decode(self, ids: Sequence[int], pos: int, kv: PagedKv, gdn: GdnState,
               max_new_tokens: int, stop_ids: set[int]) -> Decoded:
        """Forward the prompt `ids` at pos, then decode greedily up to max_new_tokens ids,
        stopping after a stop id. kv's pages need room for pos + len(ids) + max_new_tokens
        rows. The same steps as `prefill` then `decode_burst` (which let a caller stop
        between bursts), in one call."""
        t0 = time.perf_counter()
        token, gdn = self.prefill(ids, pos, kv, gdn)
        t1 = time.perf_counter()
        out, steps = [token], 0
        if max_new_tokens > 1 and token not in stop_ids:
            new, steps, _ = self.decode_burst(token, pos + len(ids), kv, gdn,
                                              max_new_tokens - 1, stop_ids)
            out += new
        self.sync()
        return Decoded(tuple(out), steps, (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3)

    def prefill(self, ids: Sequence[int], pos: int, kv: PagedKv,
                gdn: GdnState) -> tuple[int, GdnState]:
        """Forward a fork's prompt `ids` (any length >= 1) at pos (KV rows [pos, pos +
        len(ids)) are written; rows below it the prefix) and return (the greedy next id, the
        GDN states after the prompt: per GDN layer (conv [conv_dim, W], recurrent [HV, K, V]
        fp32), new tensors; `gdn` is not changed)."""
        hidden, gdn = self.model(self._ids(ids), pos, kv, gdn, self.kernels)
        return int(self.model.logits(hidden[-1:])[0].argmax()), gdn

    def decode_burst(self, token: int, pos: int, kv: PagedKv, gdn: GdnState, max_steps: int,
                     stop_ids: set[int]) -> tuple[list[int], int, GdnState]:
        """Feed `token` at pos and decode greedily up to max_steps (>= 1) ids, stopping after
        a stop id: (the new ids, the one-token steps run, the GDN states after the last step's
        input, i.e. before feeding the last new id). A burst continued by another from (its
        last id, pos + steps, its states) gives the ids one longer burst gives, bit for bit.
        kv's pages need room for pos + max_steps rows."""
        out = []
        while len(out) < max_steps and (token not in stop_ids):
            hidden, gdn = self.model(self._ids([token]), pos, kv, gdn, self.kernels)
            token = int(self.model.logits(hidden)[0].argmax())
            out.append(token)
            pos += 1
        return out, len(out), gdn

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        """[T] int64 on the model's device."""
        return torch.tensor(list(ids), dtype=torch.long, device=self.model.device)
