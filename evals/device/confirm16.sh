#!/usr/bin/env bash
# Issue 16, the confirmation: pages (this tree) against the contiguous tree (.old2) over three
# fresh pairs of workers (evals/pages_ab.py --pairs 3): the read rate over 0-32k and 64-100k
# read as a backlog (--bands), one chunk at 16k and 96k alone and in bursts of three, decode;
# or (--tests) the CUDA tests of FA4 over pages (the overlapped splits against one stream,
# bit for bit) and of the decode loop.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/confirm16.sh [--tests] (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
if [ "${1:-}" = "--tests" ]; then
    timeout 560 python3 -m pytest -q -p no:cacheprovider -rf tests/test_attn_fa4.py \
        tests/test_decode.py 2>&1 | tee "$out/gpu-tests.log" | tail -n 8
    exit 0
fi
timeout 560 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --max-context 112640 \
    --bands 0:32768,65536:102400 --ask-at "" --burst 3 --pairs 3 --repeats 3 2>&1 \
    | grep -v '^!!' | grep -v "UserWarning\|exe_args" | tee "$out/pages-ab-confirm.log" \
    | grep -E "^(pair|across|exact)" | cut -c1-300
