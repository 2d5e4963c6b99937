"""evals.question_bench on the CPU (the tiny model, SDPA, no graphs): every arm timed, every
batch's forks checked against their runner alone, the ways after the batch's own, the
profiles; its timings are for the device, only their presence is checked."""
import pytest

from evals.question_bench import _other_ways, questions_part


def test_questions_part_times_both_arms_and_checks_the_bits(tiny):
    class Args:
        grid, batches, contexts, repeats, question_rows = 64, [1, 2, 4], [128, 192], 1, [64]
        ceiling = profile = True
    out = questions_part(tiny, Args)
    assert set(out) == {f"{c}x64x{b}" for c in (128, 192) for b in (1, 2, 4)} | {
        "captures", "down_bmm", "row_ops"}
    assert set(out["down_bmm"]) == {"64x2", "64x4"} and all(
        r["bmm_ms"] > 0 and r["per_fork_ms"] > 0 and r["one_ms"] > 0 and
        isinstance(r["exact"], bool) and "splitk8" not in r        # split-K: CUDA only
        for r in out["down_bmm"].values())
    for key, row in out.items():
        if key in ("captures", "down_bmm", "row_ops"):
            continue
        if key.endswith("x1"):                          # one question: both arms the same
            assert row["exact"] is True and row["one_forward"] > 0 and "ceiling" not in row
            continue
        assert row["one_at_a_time"] > 0 and row["one_forward"] > 0 and row["exact"] is True
        assert row["speedup"] == round(row["one_at_a_time"] / row["one_forward"], 3)
        assert row["over_one"] > 0                       # over one question's own time
        assert row["ceiling"] > 0          # and the batch over it (both rounded to 3 places)
        assert abs(row["over_ceiling"] - row["one_forward"] / row["ceiling"]) < 2e-3
        # beside it every later way without FA4 in one call (SDPA on the CPU)
        assert [k for k in row if k.endswith("_exact")] == [
            "recurrences+conv+norms_exact", "recurrences+norms_exact", "per_fork_exact"]
        assert row["per_fork"] > 0 and row["per_fork_exact"] is True
        assert row["recurrences+norms"] > 0 and row["recurrences+norms_exact"] is True
        assert row["per_fork_over_one"] > 0 and "attention+recurrences" not in row
    assert set(out["row_ops"]) == {"64"}
    for ops in out["row_ops"].values():
        assert set(ops) == {"norm_rope", "gdn_gates", "gated_rms_norm", "down", "conv"}
        for name, v in ops.items():       # the CPU's eager ops: row by row; F.linear (the
            if name != "down" or tiny.gemms_keep_tile_bits(4 * 64, 64):   # down projection)
                assert v == [], name                                      # where it does
    assert out["captures"]["question_batches"] == ["2x64", "4x64"]
    profiled = [k for k, row in out.items() if "profile" in row]   # one question and the
    assert profiled == ["192x64x1", "192x64x4"]                    # largest batch at the
    for key in profiled:                                           # largest context
        prof = out[key]["profile"]
        assert prof["total_us"] > 0 and prof["kernels"] and all(
            k["calls"] >= 1 and k["us"] >= 0 for k in prof["kernels"].values())
        assert prof["num_kernels"] >= sum(k["calls"] for k in prof["kernels"].values())
    assert out["192x64x4"]["profile"]["num_kernels"] > out["192x64x1"]["profile"]["num_kernels"]
    assert out["192x64x4"]["ceiling_profile"]["total_us"] > 0           # beside the batch's
    assert [k for k, row in out.items() if "ceiling_profile" in row] == ["192x64x4"]


def test_other_ways_follow_the_checks_order_or_the_names_given():
    from adapters.runners.batch import ALL_IN_ONE, PER_FORK, WAYS
    assert _other_ways(ALL_IN_ONE, None) == list(WAYS[1:])
    assert _other_ways(ALL_IN_ONE, ["per_fork", "attention+recurrences+norms"]) == [
        PER_FORK, WAYS[3]]
    with pytest.raises(ValueError, match=r"no way \['rows'\]"):
        _other_ways(ALL_IN_ONE, ["rows"])                   # no way has the rows alone
