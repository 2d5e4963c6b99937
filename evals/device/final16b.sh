#!/usr/bin/env bash
# Issue 16, sixth session, after the table attention's pools became offsets from a base (the
# loads vectorised; DECODE with 3 stages) and KvPool kept its per-layer views: the CUDA tests
# of the attentions, runners, decode and pages; decode against FlashAttention-2 (evals/
# decode_probe.py --graph); where a chunk at 16k spends its time in each tree, stage by stage
# (evals/chunk_timeline.py of each tree: CUDA events and host times between the graphs and
# attention calls); then the interleaved A/B of the contiguous tree (.old2) and this one
# (evals/pages_ab.py).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/final16b.sh [--ab] (carry .fa4b .whl .devdata .old2): all but the A/B,
#   or (--ab, the next call: one call runs at most 10 minutes) the A/B alone
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
if [ "${1:-}" != "--ab" ]; then
timeout 130 python3 -m pytest -q -x -p no:cacheprovider tests/test_attn_triton.py \
    tests/test_decode.py tests/test_adapters.py tests/test_pages.py tests/test_attn_fa4.py \
    2>&1 | tee "$out/gpu-tests.log" | tail -n 3
timeout 50 python3 -m evals.decode_probe --graph --only decode --rounds 5 \
    --contexts 51200,102400 2>&1 | grep -v '^!!' | tee "$out/decode-probe.log" | tail -n 1 \
    | cut -c1-600
root=$PWD; outdir=$(cd "$out" && pwd)
for side in pages:. contiguous:.old2; do
    (cd "${side#*:}" && PYTHONPATH="/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD" \
        timeout 120 python3 -m evals.chunk_timeline --ids "${ids[@]/#/$root/}" \
        --contexts 16384 --decode-at 20480 --chunks 8 2>&1 | grep -v '^!!' \
        | tee "$outdir/chunk-timeline-${side%%:*}.log" | grep -A 40 "^chunk at" | head -n 40)
done
exit 0
fi
timeout 420 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --max-context 112640 \
    2>&1 | grep -v '^!!' | tee "$out/pages-ab.log" | grep -E "^(chunk|ask|decode|exact)" \
    | cut -c1-250
