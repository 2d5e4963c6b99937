#!/usr/bin/env bash
# The closing device call of issue 5's session of 2026-11-29 night (about 6 minutes on an H200,
# with the caches evals/device/host.sh packed restored from .devcache): FlashAttention's twin
# tests, the read benchmark at grid 512 (every part but the peer and other grids), the stage
# timeline, and the two-process check on fresh Triton and inductor caches with the default pin
# (~/.cache/shadow-reader/autotune). Logs to $OUT or ./out.
#   bash evals/device/final2.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attn_flash.py 2>&1 | tail -n 1
timeout 200 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --parts read,exact,decode,ask,floor,grids --out "$out/read-bench.json" \
    > "$out/read-bench.log" 2>&1
tail -n 1 "$out/read-bench.log" | cut -c1-600
timeout 150 python3 -m evals.chunk_timeline --ids "${ids[@]}" --contexts 16384 \
    --decode-at 98304 > "$out/timeline.log" 2>&1
grep -A3 "^chunk at\|^decode step" "$out/timeline.log" | cut -c1-120
rm -rf /tmp/ab-disk
env -u TORCHINDUCTOR_CACHE_DIR timeout 150 python3 -m evals.store_bench --sizes 10240,51200 \
    --ids "${ids[0]}" --more "${ids[1]}" --disk /tmp/ab-disk --fresh-caches \
    > "$out/two-process-default-pin.log" 2>&1
tail -n 1 "$out/two-process-default-pin.log" | cut -c1-700
