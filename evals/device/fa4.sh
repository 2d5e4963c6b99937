#!/usr/bin/env bash
# FlashAttention-4 on the H200 (issue 5), right after evals/device/fa4_stash.sh: the attention
# probe (evals/fa4_probe.py: FA2, FA4 with our key splits, FA4 as one call), FA4's twin tests,
# the read benchmark at grid 512 with --attention fa4 (every part but the peer), and the
# two-process check on fresh Triton and inductor caches. FA4's compiled kernels come back as
# $out/fa4cache.tgz (for .devcache). About 8 minutes.
#   bash evals/device/fa4.sh                  (carry .whl .devdata .devcache .fa4b)
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
source "$(dirname "$0")/fa4_env.sh" || exit 1
timeout 200 python3 -m evals.fa4_probe > "$out/fa4-probe.log" 2>&1
grep -v '^{' "$out/fa4-probe.log" | cut -c1-900 | tail -n 12
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_attn_fa4.py 2>&1 | tail -n 2
timeout 200 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512 \
    --attention fa4 --parts read,exact,decode,ask,floor,grids --out "$out/read-fa4.json" \
    > "$out/read-fa4.log" 2>&1
tail -n 1 "$out/read-fa4.log" | cut -c1-800
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null; ls -la "$out"
