#!/usr/bin/env bash
# Issue 16: the chunk at 16k and 96k, pages against the contiguous tree (.old2), strictly
# alternating (each chunk on a host that waited for the other tree's) and in bursts of three
# chunks back to back (evals/pages_ab.py --burst), then decode; no questions.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/burst16.sh (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
timeout 400 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --max-context 112640 \
    --ask-at "" --burst 3 2>&1 | grep -v '^!!' | tee "$out/pages-ab-burst.log" \
    | grep -E "^(chunk|bursts|decode|exact)" | cut -c1-700
