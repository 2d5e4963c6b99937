"""The probe behind the batched forward (adapters.model.batch): which ops give a sequence's rows
the same bits whether they are computed alone or in one buffer with other sequences' rows, for
the model's shapes (the tiny model's and the 0.8B's), fp32 and bf16, one and two threads.

What the batched forward relies on, asserted here where the machine's check says it holds
(the check the adapter runs on each batch, which a CPU with AMX failed for the 0.8B's shapes:
there nothing batches): a GEMM over rows tiled to multiples of ROW_TILE gives each row the bits
of its own padded rows, and of the block-by-block twin; a grid chunk needs no padding, so a
batch of chunks gives each chunk the bits of F.linear over the chunk alone; RMSNorm is
row-invariant; the per-sequence ops (SiLU, sigmoid) are run per sequence, so they need no such
fact. What it does not rely on (measured on one machine, noted in adapters/model/batch.py, not
asserted: another CPU picks other kernels): F.linear over fewer than 12 rows, and SiLU over a
concatenation with 3 threads, gave other bits."""

import pytest
import torch
import torch.nn.functional as F
from helpers import torch_threads  # noqa: E402

from adapters.model import batch, ops

# (K, N) of the projections: the tiny model's, then the 0.8B's (q, in_proj_qkv, b/a, out_proj,
# gate/up, down)
SHAPES = [(128, 512), (256, 128), (128, 4), (1024, 4096), (1024, 6144), (1024, 16),
          (2048, 1024), (3584, 1024)]
LENGTHS = [[64, 64], [5, 69, 128], [1, 3, 130], [200, 64, 7]]


def _rows(lengths, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(t, k, generator=g) * 2).to(dtype) for t in lengths]


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", SHAPES)
def test_tiled_gemm_gives_each_sequence_the_bits_of_its_own_rows(k, n, dtype, num_threads):
    """Where the check the adapter runs on each batch (batch.linear_keeps_tile_bits at the
    batch's row counts: the buffer's and each sequence's padded alone) says yes, each sequence
    gets the bits of its own rows; the tiny model's shapes must pass it (the batched tests run
    on them). A machine whose GEMMs change bits with the row count (oneDNN on AMX, for the
    0.8B's shapes: adapters/model/batch.py) gets a no: the check is never wrong."""
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(1)) * 0.05).to(dtype)
    lengths = LENGTHS if k <= 256 else LENGTHS[1:2]         # the big shapes: fewer rows
    with torch_threads(num_threads):
        for i, ls in enumerate(lengths):
            tiles = batch.RowTiles(tuple(ls))
            keeps = all(batch.linear_keeps_tile_bits([w], m)
                        for m in {*tiles.padded, tiles.num_rows})
            assert keeps or k > 256, f"the tiny model's shape ({k}, {n}) must batch"
            parts = [(x,) for x in _rows(ls, k, dtype, seed=i)]
            buf = tiles.pad([p[0] for p in parts])
            facts = [batch.rows_match(lambda x: F.linear(x, w), parts),
                     torch.equal(F.linear(buf, w), batch.linear_blocks(buf, w))]
            facts += [torch.equal(batch.tiled_linear()(x, w), rows)
                      for (x,), rows in zip(parts, tiles.split(F.linear(buf, w)))]
            assert all(facts) or not keeps, (ls, facts)
        if k <= 256:
            assert batch.linear_rows_invariant([w], 128)


@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_batched_need_no_padding_and_keep_the_alone_bits(dtype, num_threads):
    """A grid chunk's rows (a multiple of 64) in a GEMM of B chunks: the bits of F.linear over
    the chunk alone, the op the alone read runs."""
    w = (torch.randn(512, 128, generator=torch.Generator().manual_seed(2)) * 0.05).to(dtype)
    with torch_threads(num_threads):
        for b in (2, 4, 8):
            chunks = _rows([64] * b, 128, dtype, seed=b)
            big = F.linear(torch.cat(chunks), w)
            for i, c in enumerate(chunks):
                assert torch.equal(F.linear(c, w), big[64 * i:64 * (i + 1)])


@pytest.mark.parametrize("num_threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [128, 1024])
def test_rms_norm_is_row_invariant(hidden, dtype, num_threads):
    w = torch.randn(hidden, generator=torch.Generator().manual_seed(3)) * 0.1
    with torch_threads(num_threads):
        for i, ls in enumerate(LENGTHS + [[512, 512, 512]]):
            parts = [(x,) for x in _rows(ls, hidden, dtype, seed=10 + i)]
            assert batch.rows_match(lambda x: ops.rms_norm(x, w, 1e-6), parts)


def test_rows_match_sees_an_op_that_mixes_rows():
    parts = [(x,) for x in _rows([64, 64], 16, torch.float32)]
    assert not batch.rows_match(lambda x: x - x.mean(0), parts)
    assert batch.rows_match(lambda x: x * 2, parts)


def test_row_tiles_lay_sequences_at_tile_boundaries():
    tiles = batch.RowTiles((5, 64, 65))
    assert tiles.padded == (64, 64, 128) and tiles.offsets == (0, 64, 128)
    assert tiles.num_rows == 256 and tiles.rows(2) == slice(128, 193)
    x = tiles.pad([torch.full((n, 2), float(i + 1)) for i, n in enumerate((5, 64, 65))])
    assert x[5:64].abs().sum() == 0 and x[193:].abs().sum() == 0
    assert [float(v[:, 0].unique()) for v in tiles.split(x)] == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="at least one row"):
        batch.RowTiles((3, 0))
    with pytest.raises(ValueError, match="at least one row"):
        batch.RowTiles(())
