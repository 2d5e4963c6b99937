#!/usr/bin/env bash
# Issue 16, decode: the probe copy of the table attention's split kernel ran 1.6x faster than
# attn_triton's with the same tiling and bits (docs/decode-variants-2026-12-02.log); this run
# tells whether the pools' places are why: read from an int64 table as today (ptr1), or an
# anchor tensor plus element offsets (ptr2), against the pools as arguments
# (evals/decode_variants.py, CUDA-graph timed, in turns).
#   bash evals/device/decode_ptr.sh      (carry .whl)
source "$(dirname "$0")/env.sh"          # strict shell, $out, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python3 -m evals.decode_variants --rounds 5 --contexts 51200,102400 --only \
    table,table_ptr1,table_ptr2,ahead,ahead_st3,ahead_ptr1,ahead_ptr2,hoist_st3,none_st3,ahead_bn64_w8 \
    2>&1 | grep -v '^!!' | tee "$out/decode-ptr.log" | grep -v '^{' | cut -c1-3000
