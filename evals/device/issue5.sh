#!/usr/bin/env bash
# One device call (about 3 minutes on an H200): the read benchmark at grid 512 (read as chunks
# and as backlogs, exactness after the timed runs, fork decode, questions, the GEMM floor) and
# the profile of a chunk at 16k context. Logs to $OUT (the device tool's output folder) or ./out.
#   bash evals/device/issue5.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 300 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --parts read,exact,decode,ask,floor --out "$out/read-bench.json" > "$out/read-bench.log" 2>&1 || true
timeout 150 python3 -m evals.profile_chunk --graphs --ids "${ids[0]}" --context 16384 \
    > "$out/profile-16k.log" 2>&1 || true
tail -n 1 "$out"/*.log | cut -c1-1500
