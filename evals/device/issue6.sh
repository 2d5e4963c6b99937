#!/usr/bin/env bash
# The next host A/B measurements (issue 6), one device call (about 8 minutes on an H200):
# the ration leaving to the idle window what the host's gaps cover (SHADOW_IDLE_TRUST=0.5,
# trusted after four on-arm turns, hence 8 pairs), and a 1 % share without it. Logs to $OUT
# (the device tool's output folder) or ./out.
#   bash evals/device/issue6.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
SHADOW_IDLE_TRUST=0.5 timeout 330 python3 -m evals.host_ab --pairs 8 --ids "${ids[@]}" \
    > "$out/host-ab-idle-trust.log" 2>&1 || true
timeout 240 python3 -m evals.host_ab --pairs 4 --shares 0.01 --ids "${ids[@]}" \
    > "$out/host-ab-share-1pct.log" 2>&1 || true
tail -n 1 "$out"/host-ab-*.log | cut -c1-600
