"""evals.bi_bench's graphs and chunks parts on the CPU: blocks_differ finds the blocks whose bits
depend on what else is in the batch, and the parts run their code paths (eagerly, random:tiny)
to reports with every projection, op, ceiling row and batch."""
import pytest
import torch

from evals.bi_bench import chunks_part, graphs_part
from evals.probes import blocks_differ


def test_blocks_differ_names_the_blocks_a_batch_changes():
    x = torch.arange(24, dtype=torch.float32).reshape(12, 2)
    assert blocks_differ(lambda t: t * 2, [x], 3, [2, 4]) == []
    # each row minus the batch's first row: every block but the first changes in a batch
    assert blocks_differ(lambda t: t - t[:1], [x], 3, [2, 4]) == [[2, 1], [4, 1], [4, 2],
                                                                  [4, 3]]
    # a tuple of outputs, the second row-wise and the first the batch's mean: both counted
    assert blocks_differ(lambda t: (t * 0 + t.mean(), t + 1), [x], 6, [2]) == [[2, 0], [2, 1]]


def test_graphs_part_reports_every_gemm_op_and_ceiling_row(tiny):
    class Args:
        grid, batches, contexts, repeats = 64, [1, 2], [128], 1
    out = graphs_part(tiny, Args)
    assert set(out) == {"gemm_blocks_differ_64", "gemm_blocks_differ_128", "ops_blocks_differ",
                        "ceiling"}
    assert {"down_proj 128x256", "q_proj 512x128"} <= set(out["gemm_blocks_differ_64"])
    assert set(out["ops_blocks_differ"]) == {"rms_norm", "add_rms_norm", "gated_rms_norm",
                                             "swiglu", "sigmoid_gate"}
    assert set(out["ceiling"]) == {"128x1", "128x2"}
    for row in out["ceiling"].values():
        assert row["one_at_a_time"] > 0 and row["one_forward"] > 0
        assert row["speedup"] == round(row["one_at_a_time"] / row["one_forward"], 3)


def test_chunks_part_times_each_batch_and_finds_it_exact(tiny):
    class Args:
        grid, batches, contexts, repeats, profile, ceiling = 64, [1, 2, 4], [128, 192], 1, \
            True, True
        chunk_ways = ["recurrences", "per_fork"]             # beside the batch's own way
    if not tiny.gemms_keep_tile_bits(4 * 64, 64):
        pytest.skip("this CPU's GEMMs give a 64-row block other bits in a batch")
    out = chunks_part(tiny, Args)
    assert set(out) == {f"{c}x{b}" for c in (128, 192) for b in (1, 2, 4)} | {
        "captures", "chunk_ops"}
    assert out["chunk_ops"] == ["compiled"]                  # the runners' pick on the CPU
    for key, row in out.items():
        if key in ("captures", "chunk_ops"):
            continue
        assert row["one_at_a_time"] > 0 and row["one_forward"] > 0
        assert row["speedup"] == round(row["one_at_a_time"] / row["one_forward"], 3)
        b = int(key.split("x")[1])
        assert row["ids_per_s"] == round(b * 64 / row["one_forward"] * 1e3)
        assert ("exact" in row) == (b > 1) and row.get("exact", True) is True
        assert ("ceiling" in row) == (b > 1)                 # b chunks as one sequence
        if b > 1:
            assert row["ceiling"] > 0
            assert row["over_ceiling"] == pytest.approx(     # from the unrounded ms
                row["one_forward"] / row["ceiling"], rel=1e-3, abs=2e-3)
        for way in Args.chunk_ways:                          # the other ways, timed, exact
            assert (way in row) == (b > 1)
            if b > 1:
                assert row[way] > 0 and row[f"{way}_exact"] is True
                assert row[f"{way}_speedup"] == round(row["one_at_a_time"] / row[way], 3)
    assert out["captures"]["chunk_batches"] == [2, 4]
    profiled = [k for k, row in out.items() if "profile" in row]   # one chunk and the largest
    assert profiled == ["128x1", "128x4"]                          # batch, smallest context
    for key in profiled:
        prof = out[key]["profile"]
        assert prof["total_us"] > 0 and prof["num_kernels"] > 0 and prof["kernels"]
    assert "ceiling_profile" in out["128x4"] and "ceiling_profile" not in out["192x4"]
    assert out["128x4"]["ceiling_profile"]["total_us"] > 0
