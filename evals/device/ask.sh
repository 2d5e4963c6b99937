#!/usr/bin/env bash
# A device call for issue 5 (about 3 minutes on an H200, caches restored from .devcache): the
# KV layout A/B for question latency (evals/ask_ab.py), then where a chunk at 16k goes now
# (evals/profile_chunk.py --graphs). Logs to $OUT or ./out.
#   bash evals/device/ask.sh
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
timeout 200 python3 -m evals.ask_ab --ids "${ids[@]}" --turns 3 > "$out/ask-ab.log" 2>&1
grep -v '^!!' "$out/ask-ab.log" | cut -c1-300
timeout 120 python3 -m evals.profile_chunk --graphs --ids "${ids[0]}" --context 16384 \
    > "$out/profile-16k.log" 2>&1
grep -v '^!!' "$out/profile-16k.log" | cut -c1-60,130-200 | head -34
tail -n 1 "$out/profile-16k.log"
