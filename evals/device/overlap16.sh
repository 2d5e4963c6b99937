#!/usr/bin/env bash
# Issue 16, the chunk: FA4's prefix splits and causal tail on two streams against one
# (evals/fa4_overlap.py, one layer at 16k and 96k), then the chunk's A/B over two fresh pairs
# of workers, pages (this tree: the overlap, FA4's plan staged after the first graph's launch,
# ids and pages packed by struct, decode with page entries loaded a block ahead) against the
# contiguous tree (.old2), chunks alone and in bursts of three, decode; or (--tests) the CUDA
# tests of FA4, its plan, the runners and decode.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/overlap16.sh [--tests] (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
if [ "${1:-}" = "--tests" ]; then
    timeout 540 python3 -m pytest -q -p no:cacheprovider tests/test_attn_fa4.py \
        tests/test_fa4_plan.py tests/test_adapters.py tests/test_decode.py 2>&1 \
        | tee "$out/gpu-tests.log" | tail -n 5
    exit 0
fi
timeout 90 python3 -m evals.fa4_overlap 2>&1 | grep -v '^!!' | tee "$out/fa4-overlap.log" \
    | grep -v '^{' | cut -c1-400
timeout 450 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --max-context 112640 \
    --ask-at "" --burst 3 --pairs 2 --repeats 2 2>&1 | grep -v '^!!' \
    | grep -v "UserWarning\|exe_args" | tee "$out/pages-ab-pairs.log" \
    | grep -E "^(pair|across|exact)" | cut -c1-300
