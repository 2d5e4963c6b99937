#!/usr/bin/env bash
# The run of record for issue 5 with FlashAttention-4 (the default attention where it runs),
# right after evals/device/fa4_stash.sh: the read benchmark with every part (grids 512, 1024,
# 2048, the transformers peer), the two-process check on fresh Triton and inductor caches with
# the default pin, the attention probe (evals/fa4_probe.py) and FA4's GPU tests. About 9
# minutes with FA4's kernels restored from .devcache/fa4cache.tgz.
#   bash evals/device/fa4_final.sh            (carry .whl .devdata .devcache .fa4b)
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
source "$(dirname "$0")/fa4_env.sh" || exit 1
timeout 300 python3 -m evals.read --ids "${ids[@]}" --max-context 102400 --grids 512,1024,2048 \
    --parts read,exact,decode,ask,floor,grids,peer --out "$out/read-bench.json" \
    > "$out/read-bench.log" 2>&1
tail -n 1 "$out/read-bench.log" | cut -c1-700
rm -rf /tmp/ab-disk
env -u TORCHINDUCTOR_CACHE_DIR timeout 130 python3 -m evals.store_bench --sizes 10240,51200 \
    --ids "${ids[0]}" --more "${ids[1]}" --disk /tmp/ab-disk --fresh-caches \
    > "$out/two-process.log" 2>&1
tail -n 1 "$out/two-process.log" | cut -c1-700
timeout 90 python3 -m evals.fa4_probe > "$out/fa4-probe.log" 2>&1
grep '^T' "$out/fa4-probe.log" | cut -c1-1200
timeout 50 python3 -m pytest -q -p no:cacheprovider tests/test_attn_fa4.py 2>&1 | tail -n 2
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null; ls -la "$out"
