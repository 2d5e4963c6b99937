#!/usr/bin/env bash
# Issue 16, next: the chunk's A/B over several pairs of fresh workers (two workers of one tree
# differed by 3 % on the H200, docs/pages-ab-same-tree-2026-12-02.log), pages against the
# contiguous tree (.old2), chunks alone and in bursts of three, no questions
# (evals/pages_ab.py --pairs 3: one pair with bursts took 219 s on a fresh machine, less with
# FA4's compile cache warm); or (--tests) the CUDA tests of decode, runners, pages and FA4
# (test_attn_triton runs under the interpreter there: left out), then DECODE against DECODE
# with each page entry loaded a block ahead (SplitConfig.ahead; evals/decode_probe.py --graph).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/pairs16.sh [--tests] (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
if [ "${1:-}" = "--tests" ]; then
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py \
        tests/test_adapters.py tests/test_pages.py tests/test_attn_fa4.py tests/test_kv_pool.py \
        2>&1 | tee "$out/gpu-tests.log" | tail -n 5
    timeout 60 python3 -m evals.decode_probe --graph --only decode,decode_ahead --rounds 5 \
        --contexts 51200,102400 2>&1 | grep -v '^!!' | tee "$out/decode-probe-ahead.log" \
        | tail -n 1 | cut -c1-700
    exit 0
fi
timeout 560 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --max-context 112640 \
    --ask-at "" --burst 3 --pairs 3 --repeats 2 2>&1 | grep -v '^!!' \
    | tee "$out/pages-ab-pairs.log" | grep -E "^(pair|across|exact)" | cut -c1-300
