#!/usr/bin/env bash
# Issue 16, where the backlog's 4-5 % goes. On 2026-12-02 (confirm16.sh, three fresh pairs) the
# read rate over 0-32k and 64-100k was +4.1 / +4.8 % against contiguous buffers, one chunk at
# 16k +0.1 % and at 96k +4.5 %. Two calls after evals/device/fa4_stash.sh, each within 30 s of
# the last:
#   (default) pages with FA4's overlapped splits (this tree) against the same tree with the
#     splits and the causal tail on one stream (a copy in /tmp/serial, FA4Attention's
#     `overlap` default off), two fresh pairs, bands and chunks: what the overlap does to a
#     backlog;
#   --profile: pages against the contiguous tree (.old2), one pair with --profile: chunks
#     8-15 of each band's backlog, a chunk at 16k and 96k and a decode, kernel by kernel with
#     the idle gaps. The bands are timed before any profile and profiled last; the 96k
#     chunk and the decode are timed after the 16k chunk's profile (their clean figures come
#     from the default call and confirm16.sh).
#   --graph: evals/fa4_graph_probe.py at 16k, 64k and 96k and at two positions whose causal
#     tails are longer than the chunk: whether FA4's calls over pages, in fixed-width tables
#     with the key counts on the device, equal the runner's bit for bit eagerly and replayed
#     from one CUDA graph captured at 16k, and one layer's milliseconds of each.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/isolate16.sh [--profile | --graph]
#     (carry .fa4b .whl .devdata .old2, and .devcache when it holds fa4cache.tgz)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
common=(--ids "${ids[@]}" --max-context 112640 --bands 0:32768,65536:102400 --ask-at ""
        --repeats 3)
case "${1:-}" in
--graph)
    # 16576 and 98752: causal tails of 704 and 960 keys (longer than the 512 queries)
    timeout 560 python3 -m evals.fa4_graph_probe --contexts 16384,16576,65536,98304,98752 \
        2>&1 | tee "$out/fa4-graph-probe.log" | grep -E '^(\{|#)' | cut -c1-700 ;;
--profile)
    timeout 560 python3 -m evals.pages_ab --a .old2 --b . "${common[@]}" --profile 2>&1 \
        | grep -v '^!!' | grep -v "UserWarning\|exe_args" | tee "$out/pages-ab-profile.log" \
        | grep -E "^(read rate|chunk at|decode|exact|profile)" | cut -c1-300 ;;
*)
    rm -rf /tmp/serial && mkdir -p /tmp/serial && cp -r adapters block_store shadow_plugin \
        evals /tmp/serial/ || exit 1
    sed -i 's/overlap: bool = True/overlap: bool = False/' \
        /tmp/serial/adapters/model/attn_fa4.py || exit 1
    (cd /tmp/serial && PYTHONPATH=/tmp/serial:$PYTHONPATH python3 -c '
import inspect, adapters.model.attn_fa4 as m
assert m.__file__.startswith("/tmp/serial"), m.__file__
assert inspect.signature(m.FA4Attention).parameters["overlap"].default is False
print("the copy in /tmp/serial runs FA4 on one stream")') || exit 1
    timeout 540 python3 -m evals.pages_ab --a /tmp/serial --b . "${common[@]}" --pairs 2 2>&1 \
        | grep -v '^!!' | grep -v "UserWarning\|exe_args" | tee "$out/pages-ab-serial.log" \
        | grep -E "^(pair|across|exact)" | cut -c1-300
    echo "took ${SECONDS} s" ;;
esac
# FA4's compiled kernels for a later cold machine: copy fa4cache.tgz from the call's files to
# .devcache/ and carry .devcache too (fa4_env.sh restores it; first compiles take 100-123 s)
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
