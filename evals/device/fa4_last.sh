#!/usr/bin/env bash
# After evals/device/fa4_final.sh (and a fresh evals/device/fa4_stash.sh): FA4's GPU tests,
# the kernel profile of a chunk at 16k with FA4, and the 2B and 4B shapes (read to 32k, no
# targets). About 6 minutes.
#   bash evals/device/fa4_last.sh             (carry .whl .devdata .devcache .fa4b)
source "$(dirname "$0")/env.sh"      # $out, ${ids[@]}, caches
source "$(dirname "$0")/fa4_env.sh" || exit 1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_attn_fa4.py > "$out/tests.log" 2>&1
tail -n 3 "$out/tests.log"
timeout 90 python3 -m evals.profile_chunk --graphs --ids "${ids[0]}" --context 16384 \
    > "$out/profile-16k.log" 2>&1
grep -v '^!!' "$out/profile-16k.log" | cut -c1-60,130-200 | head -34
tail -n 1 "$out/profile-16k.log"
for m in 2b 4b; do
    timeout 140 python3 -m evals.read --model random:qwen3.5-$m --ids "${ids[@]}" \
        --max-context 32768 --grids 512 --ask-at 8192,32768 --parts read,exact,decode,ask,floor \
        --out "$out/read-$m.json" > "$out/read-$m.log" 2>&1
    tail -n 1 "$out/read-$m.log" | cut -c1-900
done
