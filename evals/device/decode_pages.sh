#!/usr/bin/env bash
# Issue 16, decode over pages: the table attention with page splits (whole 512-row pages a
# split, one page-table load a page) against today's DECODE tiling, the block walk with as many
# splits (bn32_s256) and FlashAttention-2 on contiguous rows, one query row at 25k / 50k / 100k
# (evals/decode_probe.py, CUDA events, medians of 50 calls; bits under two page orders).
#   bash evals/device/decode_pages.sh      (carry .whl)
source "$(dirname "$0")/env.sh"          # strict shell, $out, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 400 python3 -m evals.decode_probe --only \
    decode,bn32_s128,bn32_s256,bn32_s256_w2,pages_s256,pages_s128,pages_s256_bn64,pages_s256_w2,pages_s256_st3 \
    2>&1 | grep -v '^!!' | tee "$out/decode-probe.log" | tail -n 4 | cut -c1-3000
