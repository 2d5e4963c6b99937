#!/usr/bin/env bash
# Issue 16's speed targets, interleaved (evals/pages_ab.py): the contiguous tree (.old2: `git
# archive e98a38a adapters block_store shadow_plugin evals`) and this one as two workers taking
# turns, FA4 (after fa4_stash.sh in the call before, within 30 s).
#   bash evals/device/pages_ab.sh      (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
timeout 540 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" 2>&1 | grep -v '^!!' | tee "$out/pages-ab.log" \
    | tail -n 8 | cut -c1-600
