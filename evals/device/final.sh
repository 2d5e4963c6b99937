#!/usr/bin/env bash
# One device call (about 9 minutes on an H200): the FlashAttention twin tests (run once with
# a packed decode since set aside), the read benchmark at grid 512, and the host A/B with the default
# scheduler after 4 warm turns. Logs to $OUT (the device tool's output folder) or ./out.
#   bash evals/device/final.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attn_flash.py > "$out/attn-flash-tests.log" 2>&1
timeout 200 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --parts read,exact,decode,ask,floor --out "$out/read-bench.json" > "$out/read-bench.log" 2>&1
timeout 270 python3 -m evals.host_ab --pairs 5 --warm-turns 4 --ids "${ids[@]}" \
    > "$out/host-ab-defaults.log" 2>&1
tail -n 3 "$out/attn-flash-tests.log"; tail -n 1 "$out/read-bench.log" | cut -c1-900
grep -v '^!!' "$out/host-ab-defaults.log" | cut -c1-700
