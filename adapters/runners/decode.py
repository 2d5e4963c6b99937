"""Greedy decoding through a single-token runner with the token fed back on the device: each
step replays the runner (runners.graphs.ChunkGraphs, T = 1) and a tail graph that takes the
argmax of the logits as the next step's id, advances the position and copies the new GDN states
into the runner's inputs. The host never waits for a token except every `check_every` steps,
when it reads the new ids back to look for a stop id, so its launches run ahead of the GPU.

The steps do exactly what Adapter._decode_steps' eager loop does (runner, Qwen35.logits,
argmax), so the ids are the same (tested on the CPU, where the same code runs without graphs).
A stop id is seen up to check_every - 1 steps late: those steps' ids are dropped, their KV rows
(above C, scratch) are never read.
"""
from __future__ import annotations

import torch

from adapters.runners import capture


class DecodeLoop:
    """Greedy steps on `runner` (a ChunkGraphs with t = 1) of `model` (Qwen35)."""

    def __init__(self, model, runner):
        if runner.t != 1:
            raise ValueError(f"the decode loop needs a single-token runner, got t = {runner.t}")
        self.model, self.runner = model, runner
        self.graph: torch.cuda.CUDAGraph | None = None

    def _tail(self) -> None:
        """Next id (argmax of the logits of the step's hidden) and position into the runner's
        meta; the step's GDN states into its inputs."""
        r = self.runner
        token = self.model.logits(r.hidden)[0].argmax()
        r.meta[0].copy_(token)
        r.meta[1].add_(1)
        for part in (0, 1):
            torch._foreach_copy_([x[part] for x in r.gdn_in], [x[part] for x in r.gdn_out])

    def _capture(self) -> None:
        """Capture the tail (after a warm-up on a side stream, as the runner does; both change
        the runner's inputs, which `run` stages afterwards)."""
        side = capture.side_stream(self.runner)      # one stream: one cuBLAS workspace
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            self._tail()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self._tail()

    def prepare(self) -> None:
        """Capture the runner's graphs and the tail now (on CUDA), so the first fork does not
        pay for them."""
        self.runner.prepare()
        if self.runner.use_graphs and self.graph is None:
            self._capture()

    @torch.no_grad()
    def states(self) -> list:
        """Copies of the runner's input states after a `run`: per GDN layer (conv
        [conv_dim, W], recurrent [HV, K, V] fp32), the states after the last step's input,
        from which a next run fed the last id returned continues exactly."""
        return [(c.clone(), r.clone()) for c, r in self.runner.gdn_in]

    @torch.no_grad()
    def run(self, token: int, pos: int, kv: list, gdn: list, max_steps: int, stop_ids: set[int],
            check_every: int = 8) -> tuple[list[int], int]:
        """Feed `token` at `pos` and decode greedily: returns (up to max_steps new ids, the last
        one a stop id if one came; the steps run, which count those past a stop id seen late).
        kv: the fork's pages (a block_store.PagedKv holding rows >= pos + max_steps; rows at
        and above pos are written); gdn: the
        states after pos - 1, per GDN layer (conv [conv_dim, W], recurrent [HV, K, V] fp32),
        not changed. Raises ValueError for pages too few for max_steps."""
        r = self.runner
        if kv.num_rows < pos + max_steps:
            raise ValueError(f"{len(kv.pages)} pages of {kv.page_rows} rows cannot take "
                             f"{max_steps} steps from {pos}")
        self.prepare()
        r._stage([token], pos, kv)
        r.slots.feed(gdn)                  # the tail rewrites these inputs at every step
        new = torch.empty(max_steps, dtype=torch.long, device=r.meta.device)
        out: list[int] = []
        r._kv = kv
        try:
            for i in range(max_steps):
                r._pos = pos + i
                if r.use_graphs:
                    r._replay()
                    self.graph.replay()
                else:
                    r._body()
                    self._tail()
                new[i].copy_(r.meta[0])
                if (i + 1) % check_every == 0 or i + 1 == max_steps:
                    for t in new[len(out):i + 1].tolist():     # waits for the GPU
                        out.append(t)
                        if t in stop_ids:
                            return out, i + 1
        finally:
            r._kv = None
        return out, max_steps
