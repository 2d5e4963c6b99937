#!/usr/bin/env bash
# The last device call of 2026-11-29 night for issue 5 (about 3 minutes on an H200, caches
# restored from .devcache): the read benchmark at grid 512 with v made contiguous in the GDN
# gates (ops.gdn_gates), and the kernel profile of a chunk at 16k. Logs to $OUT or ./out.
#   bash evals/device/last.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 170 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --parts read,exact,decode,ask,floor --out "$out/read-bench.json" > "$out/read-bench.log" 2>&1
tail -n 1 "$out/read-bench.log" | cut -c1-900
timeout 90 python3 -m evals.profile_chunk --graphs --ids "${ids[0]}" --context 16384 \
    > "$out/profile-16k.log" 2>&1
grep -v '^!!' "$out/profile-16k.log" | cut -c1-60,130-200 | head -32
tail -n 1 "$out/profile-16k.log"
