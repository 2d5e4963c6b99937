#!/usr/bin/env bash
# Issue 16's two speed misses, kernel by kernel: the table attention's decode with its
# page-table entries read as a vector before their blocks (table_group) against today's DECODE
# and other tilings and FlashAttention-2 (evals/decode_probe.py --graph: each call captured
# in a CUDA graph, so no host time counts; in turns, 5 rounds), then the interleaved A/B of
# the contiguous tree (.old2) and this one with a profile of a chunk at 16k and 96k and of a
# decode in each (evals/pages_ab.py --profile; evals/kernel_profile.py).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/profile16.sh (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
[ "${1:-}" = "--ab-only" ] || timeout 200 python3 -m evals.decode_probe --graph --only \
    decode,tg4,tg4_st3,bn64,bn64_s64_st3,bn64_s64_w8,bn128_s64_w8,bn32_s64,bn64_s32,bn64_s128,bn32_s256 \
    --rounds 5 --contexts 51200,102400 2>&1 | grep -v '^!!' | tee "$out/decode-probe-tg.log" \
    | tail -n 3 | cut -c1-2500
timeout 360 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --ask-at "" --profile \
    2>&1 | grep -v '^!!' | tee "$out/pages-ab-profile.log" | grep -v '^{' | cut -c1-140 | tail -n 90
