#!/usr/bin/env bash
# A device call for issue 5 (about 6 minutes on an H200): the single-row projection probe
# (cuBLAS against model.gemv, evals/gemv_probe.py), then the read benchmark at grid 512 with the
# decode runner's projections through model.gemv. Restores the caches the last call packed
# (.devcache, see evals/device/host.sh). Logs to $OUT or ./out.
#   bash evals/device/gemv.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 120 python3 -m evals.gemv_probe > "$out/gemv-probe.log" 2>&1
grep -v '^{' "$out/gemv-probe.log" | tail -n 8
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attn_flash.py 2>&1 | tail -n 1
timeout 240 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --parts read,exact,decode,ask,floor --out "$out/read-bench.json" > "$out/read-bench.log" 2>&1
tail -n 1 "$out/read-bench.log" | cut -c1-1000
