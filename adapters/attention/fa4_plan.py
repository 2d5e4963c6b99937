"""What FlashAttention-4's calls over pages need from the host, for a run of T rows at pos
(attention.fa4): how the keys before the chunk are split (`split_plan`) and the int32 tables
of sub-pages FA4 reads the pools through (`Plan`, written by `plan_into` into a runner's
staging buffer, so they reach the device in the run's one copy). Pure numpy and torch views:
no kernel, no package import.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MIN_SPLIT_KEYS = 1024     # fewest keys a prefix split holds
SUB_PAGE = 64             # rows of a sub-page as FA4 reads the pools (= its key tile)
TILE_MN = (128, SUB_PAGE)
MAX_SPLITS = 64
# rows of one FA4 SM90 tile for head_dim > 96 (its _tile_size_fwd_sm90; 192 below): Qwen3.5's
# attention heads are 256 wide
TILE_M = 128


def split_plan(pos: int, t: int, num_heads: int, num_kv_heads: int,
               num_sms: int) -> tuple[int, int]:
    """(S, Ls): S prefix splits of Ls keys each over keys [0, S * Ls) <= pos, enough for the
    tiles of all splits to fill the GPU once (S * tiles <= num_sms); (0, 0), one causal call,
    when fewer than 2 splits of MIN_SPLIT_KEYS fit before pos or the tiles of one call already
    take half the SMs or more. Ls is a multiple of 128."""
    tiles = -(-t * (num_heads // num_kv_heads) // TILE_M) * num_kv_heads
    s = min(num_sms // tiles, pos // MIN_SPLIT_KEYS, MAX_SPLITS)
    if s < 2:
        return 0, 0
    return s, pos // s // 128 * 128


def all_splits(t: int, num_heads: int, num_kv_heads: int, num_sms: int) -> list[int]:
    """Every S split_plan can give runs of t rows (at some pos), in order: 0, then 2 up to the
    most whose tiles fit the SMs once."""
    tiles = -(-t * (num_heads // num_kv_heads) // TILE_M) * num_kv_heads
    return [0] + list(range(2, min(num_sms // tiles, MAX_SPLITS) + 1))


@dataclass(frozen=True)
class Plan:
    """One run's FA4 inputs, shared by its layers: pos, t, the splits (S, Ls) and the page
    tables of sub-pages (int32 on the device): split [S, Ls / SUB_PAGE] (None for S = 0) and
    tail [1, (pos + t - S Ls) / SUB_PAGE]."""

    pos: int
    t: int
    splits: tuple[int, int]
    split: torch.Tensor | None
    tail: torch.Tensor


def plan_size(end: int, page_rows: int) -> int:
    """int32 entries `FA4Attention.plan_into` may write for rows [0, end): every sub-page,
    and 4 of alignment."""
    return -(-end // page_rows) * (page_rows // SUB_PAGE) + 4


def sub_pages(pages, page_rows: int, start: int, end: int) -> np.ndarray:
    """int32 sub-page indices (pools read as [num_pages * page_rows / SUB_PAGE, SUB_PAGE, ...])
    of sequence rows [start, end), both multiples of SUB_PAGE."""
    return all_sub_pages(pages, page_rows)[start // SUB_PAGE:end // SUB_PAGE]


def all_sub_pages(pages, page_rows: int) -> np.ndarray:
    """int32 [len(pages) * page_rows / SUB_PAGE]: the sub-pages of every row of the pages, in
    row order (one vectorised expression: the host builds it for every chunk)."""
    per = page_rows // SUB_PAGE
    return (np.asarray(pages, dtype=np.int32)[:, None] * per
            + np.arange(per, dtype=np.int32)[None, :]).ravel()


def check_rows(pos: int, t: int) -> None:
    """ValueError unless pos and pos + t are multiples of SUB_PAGE (what the tables cover)."""
    if (pos + t) % SUB_PAGE or pos % SUB_PAGE:
        raise ValueError(f"FA4 over pages reads rows in sub-pages of {SUB_PAGE}: "
                         f"pos {pos} and pos + t {pos + t} must be multiples")


def plan_into(pos: int, t: int, heads: tuple[int, int], num_sms: int, pages: np.ndarray,
          page_rows: int, host: np.ndarray, dev: torch.Tensor) -> tuple[Plan, int]:
    """The page tables of a run at pos of t rows (heads: (num_heads, num_kv_heads); num_sms:
    the GPU's) written into host (int32, at least plan_size(pos + t, page_rows) long),
    returned as views of dev (int32 on the device, the same length: the caller copies
    host[:used] there before the first attend, in one copy with its other inputs).
    pages: int64 [>= (pos + t) / page_rows]. Returns (plan, used): the tail's table at
    [0, tail), the splits' at the next multiple of 4 (16-byte aligned when host and dev
    are). Raises ValueError when pos or pos + t is not a multiple of SUB_PAGE (what the
    sub-page tables cover)."""
    check_rows(pos, t)
    end = pos + t
    s, ls = split_plan(pos, t, *heads, num_sms)
    per, n = page_rows // SUB_PAGE, end // SUB_PAGE
    cut = s * ls // SUB_PAGE
    tail, at = n - cut, -(-(n - cut) // 4) * 4
    sub = (pages[:-(-end // page_rows), None] * per + np.arange(per)).ravel()
    host[:tail] = sub[cut:n]
    host[at:at + cut] = sub[:cut]
    plan = Plan(pos, t, (s, ls), dev[at:at + cut].view(s, -1) if s else None,
                dev[:tail].view(1, -1))
    return plan, at + cut
