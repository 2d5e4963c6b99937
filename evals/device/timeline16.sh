#!/usr/bin/env bash
# Issue 16: a chunk at 16k and at 96k stage by stage in each tree (evals/chunk_timeline.py of
# the tree: CUDA events and host times between the graphs and the attention calls), pages
# first, then the contiguous tree (.old2).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/timeline16.sh (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
root=$PWD; outdir=$(cd "$out" && pwd)
for side in pages:. contiguous:.old2; do
    (cd "${side#*:}" && PYTHONPATH="/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD" \
        timeout 250 python3 -m evals.chunk_timeline --ids "${ids[@]/#/$root/}" \
        --contexts 16384,98304 --decode-at 102400 --chunks 8 2>&1 | grep -v '^!!' \
        | tee "$outdir/chunk-timeline-${side%%:*}.log" | grep -A 26 "^chunk at" \
        | awk '{print $1, $2, $3}' | paste -sd ' ' | fold -w 2000)
done
