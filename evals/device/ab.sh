#!/usr/bin/env bash
# A device call for issue 5 (about 6 minutes on an H200; run 2026-11-29, logs in
# docs/ops-ab-, two-process- and two-process-pinned-2026-11-29.log): the two fused op sets in
# one process (the compiled GDN conv against the kernel set's conv, chunks alternating);
# then a state spilled by one process and read further by a second that starts with empty
# Triton and inductor caches (as on another machine), without (SHADOW_AUTOTUNE_DIR=off) and
# with fla's picks pinned (adapters/model/autotune.py).
# Logs to $OUT (the device tool's output folder) or ./out.
#   bash evals/device/ab.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 240 python3 -m evals.ops_ab --ids "${ids[@]}" --contexts 512,8192,16384,65536 \
    > "$out/ops-ab.log" 2>&1
for pin in off /tmp/fla-picks; do
    rm -rf /tmp/ab-disk
    [ "$pin" != off ] && unset TORCHINDUCTOR_CACHE_DIR     # the pin keeps inductor's cache too
    SHADOW_AUTOTUNE_DIR=$pin timeout 150 python3 -m evals.store_bench --sizes 10240,51200 \
        --ids "${ids[0]}" --more "${ids[1]}" \
        --disk /tmp/ab-disk --fresh-caches > "$out/two-process$([ "$pin" != off ] && echo -pinned).log" 2>&1
done
ls /tmp/fla-picks /tmp/fla-picks/inductor 2>/dev/null | head -20
grep -v '^!!' "$out/ops-ab.log" | tail -n 5
tail -n 1 "$out"/two-process*.log | cut -c1-400
