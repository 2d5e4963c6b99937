#!/usr/bin/env bash
# FlashAttention-4 against FlashAttention-2 on the H200 (issue 5), right after
# bench/device_fa4_stash.sh: the attention probe (bench/fa4_probe.py), then the read benchmark
# at grid 512 with --attention fa4 and with --attention flash, in that order on the same machine.
# FA4's compiled kernels come back as $out/fa4cache.tgz. About 8 minutes.
#   bash bench/device_fa4.sh                  (carry .whl .devdata .devcache .fa4b)
source "$(dirname "$0")/device_env.sh"      # $out, ${ids[@]}, caches
source "$(dirname "$0")/device_fa4_env.sh" || exit 1
timeout 130 python3 bench/fa4_probe.py > "$out/fa4-probe.log" 2>&1
grep -v '^{' "$out/fa4-probe.log" | cut -c1-700 | tail -n 12
for a in fa4 flash; do
    timeout 200 python3 bench/read.py --ids "${ids[@]}" --max-context 102400 --grids 512 \
        --attention $a --parts read,exact,decode,ask,floor --out "$out/read-$a.json" \
        > "$out/read-$a.log" 2>&1
    tail -n 1 "$out/read-$a.log" | cut -c1-1000
done
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null; ls -la "$out"
