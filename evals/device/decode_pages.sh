#!/usr/bin/env bash
# Issue 16, decode over pages: the table attention with page splits (whole 512-row pages a
# split, one page-table load a page) against today's DECODE tiling, the block walk with as many
# splits (bn32_s256) and FlashAttention-2 on contiguous rows, one query row at 25k / 50k / 100k
# (evals/decode_probe.py, CUDA events, medians of 50 calls; bits under two page orders), then
# the closest ones again timed in turns, 15 rounds (--rounds), at 25k and 100k.
#   bash evals/device/decode_pages.sh [--rounds-only]      (carry .whl)
source "$(dirname "$0")/env.sh"          # strict shell, $out, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
if [ "${1:-}" != "--rounds-only" ]; then
timeout 400 python3 -m evals.decode_probe --only \
    decode,bn32_s128,bn32_s256,bn32_s256_w2,pages_s256,pages_s128,pages_s256_bn64,pages_s256_w2,pages_s256_st3 \
    2>&1 | grep -v '^!!' | tee "$out/decode-probe.log" | tail -n 4 | cut -c1-3000
fi
timeout 400 python3 -m evals.decode_probe --only decode,bn32_s128,bn32_s256_w2,pages_s128,pages_s256,pages_s256_st3 \
    --rounds 15 --contexts 25600,102400 2>&1 | grep -v '^!!' | tee "$out/decode-probe-rounds.log" \
    | tail -n 3 | cut -c1-1500
