"""A chunk runner's GDN state slots (runners.graphs.ChunkGraphs): the static input states its
graphs read, the output states its body leaves in the graphs' memory, and the copies in and
out of a run.

The host's time before a chunk's first kernel is the GPU's idle time when chunks are read one
at a time (evals/chunk_timeline.py at cadb457 measured 0.11 ms of a 5.0 ms chunk at 16k in
the copy-in calls on the H200's host). Slots made with keep=True (the reader's chunk runner)
also copy the output states into the inputs at the end of a run, while the GPU is still busy,
and skip the copy in at the next run when given exactly the states that run returned: the
same tensors, unchanged since (torch's version counters), as when one session is read chunk
after chunk.
Bits are the same either way (a copy of the same values).
"""
from __future__ import annotations

import torch


def flat(pairs) -> list[torch.Tensor]:
    """[(a, b), (c, d)] -> [a, b, c, d]: the tensors of per-layer pairs in order."""
    return [x for pair in pairs for x in pair]


def versions(gdn: list) -> tuple[list, list[int]] | None:
    """(gdn, each tensor's version counter), None for tensors without one (inference mode)."""
    try:
        return gdn, [x._version for x in flat(gdn)]
    except RuntimeError:
        return None


def same(fed: tuple[list, list[int]], gdn: list) -> bool:
    """gdn holds the very tensors of fed, none changed in place since (same versions)."""
    kept, counts = fed
    if len(kept) != len(gdn):
        return False
    now = versions(gdn)
    return now is not None and all(a is b for a, b in zip(flat(kept), flat(gdn))) \
        and now[1] == counts


def stacked(xs: list[torch.Tensor]) -> torch.Tensor:
    """torch.stack(xs): [len(xs), *shape]; a view, not a copy, where xs are contiguous
    blocks of one shape and dtype lying one after another in one storage (as `StateSlots.
    block` lays out a batch's slots), else a new tensor."""
    first = xs[0]
    n = first.numel()
    if all(x.is_contiguous() and x.shape == first.shape and x.dtype == first.dtype
           and x.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
           and x.storage_offset() == first.storage_offset() + i * n for i, x in enumerate(xs)):
        return first.as_strided((len(xs), *first.shape), (n, *first.stride()),
                                first.storage_offset())
    return torch.stack(xs)


class StateSlots:
    """inputs: per GDN layer (conv [conv_dim, W] model dtype, recurrent [HV, K, V] fp32), the
    graphs' static inputs (zeros of their own, or those given: `block`); outputs: per GDN
    layer the (conv, recurrent) the body left (set by the runner's body); keep: see the module
    doc. returned: False for a runner whose runs give back no states (a question runner,
    runners.runners): `take` is refused, and `release` lets go of the outputs, so that a CUDA
    graph's output states (19.8 MB a graph on the 0.8B: 18 recurrent states of 1 MiB and the
    conv states) go back to the graphs' memory pool for the next capture instead of staying
    held per graph."""

    def __init__(self, cfg, device, dtype, keep: bool = False, returned: bool = True,
                 inputs: list | None = None):
        hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        self.inputs = inputs or [(torch.zeros(cfg.conv_dim, cfg.linear_conv_kernel_dim,
                                              device=device, dtype=dtype),
                                  torch.zeros(hv, kd, vd, device=device, dtype=torch.float32))
                                 for _ in cfg.linear_layers]
        self.outputs: list = [None] * len(cfg.linear_layers)
        self.keep, self.returned = keep, returned
        self.fed: tuple[list, list[int]] | None = None   # the states inputs hold a copy of

    @classmethod
    def block(cls, cfg, device, dtype, num_seqs: int, **kw) -> list[StateSlots]:
        """num_seqs StateSlots whose inputs lie one after another in one tensor per GDN layer
        and part ([num_seqs, conv_dim, W] and [num_seqs, HV, K, V] fp32), so that `stacked`
        of any first b of them is a view: a batch of their forks reads its states in place.
        kw: as the constructor's."""
        hv, kd, vd = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        layers = [(torch.zeros(num_seqs, cfg.conv_dim, cfg.linear_conv_kernel_dim,
                               device=device, dtype=dtype),
                   torch.zeros(num_seqs, hv, kd, vd, device=device, dtype=torch.float32))
                  for _ in cfg.linear_layers]
        return [cls(cfg, device, dtype, inputs=[(c[i], r[i]) for c, r in layers], **kw)
                for i in range(num_seqs)]

    def feed(self, gdn: list) -> None:
        """Copy gdn (per GDN layer (conv, recurrent)) into the inputs, unless they hold these
        very states already."""
        fed, self.fed = self.fed, None
        if fed is not None and same(fed, gdn):
            return
        for part in (0, 1):                         # conv states, then recurrent (one dtype each)
            torch._foreach_copy_([x[part] for x in self.inputs], [x[part] for x in gdn])

    def release(self) -> None:
        """Let go of the outputs (slots that return none); nothing otherwise."""
        if not self.returned:
            self.outputs[:] = [None] * len(self.outputs)

    def take(self) -> list:
        """The outputs copied into new tensors (and, with keep, into the inputs for the next
        run); returns them as a gdn list. Raises RuntimeError for slots that return none."""
        if not self.returned:
            raise RuntimeError("these state slots return no states (returned=False: a "
                               "question runner's)")
        out = []
        for part in (0, 1):
            src = [x[part] for x in self.outputs]
            new = [torch.empty_like(x) for x in src]
            if self.keep:
                torch._foreach_copy_(new + [x[part] for x in self.inputs], src + src)
            else:
                torch._foreach_copy_(new, src)
            out.append(new)
        gdn = list(zip(*out))
        if self.keep:
            self.fed = versions(gdn)
        return gdn


class SlotGroup:
    """A batch's StateSlots (runners.batch) as fa4_graph.SplitGraphs takes one
    runner's: `outputs`, every fork's output states in one list (fork b's GDN layer g at
    b * L + g, L GDN layers: a graph keeps them all), `returned` and `release`; `take` hands
    each fork's through its own slots. Raises ValueError for slots that differ in
    `returned`."""

    def __init__(self, slots: list[StateSlots]):
        if len({s.returned for s in slots}) != 1:
            raise ValueError("a batch's state slots all return states or none do")
        self.slots = slots
        self.num_layers = len(slots[0].outputs)
        self.outputs: list = [None] * (len(slots) * self.num_layers)
        self.returned = slots[0].returned

    def set(self, b: int, g: int, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Fork b's new states of GDN layer g: conv [conv_dim, W], recurrent [HV, K, V] fp32
        (views of the batch's outputs are fine: `take` copies them)."""
        self.outputs[b * self.num_layers + g] = (conv, recurrent)

    def release(self) -> None:
        """Let go of the outputs (slots that return none); nothing otherwise."""
        if not self.returned:
            self.outputs[:] = [None] * len(self.outputs)

    def take(self) -> list[list]:
        """Each fork's outputs copied into new tensors (StateSlots.take through its own
        slots): a gdn list per fork. Raises RuntimeError for slots that return none."""
        n, out = self.num_layers, []
        for b, slots in enumerate(self.slots):
            slots.outputs[:] = self.outputs[b * n:(b + 1) * n]
            out.append(slots.take())
        return out
