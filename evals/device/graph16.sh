#!/usr/bin/env bash
# Issue 16, the one-graph chunk: FA4's calls inside the chunk's CUDA graph, one graph per number
# of splits (model.fa4_graph; evals/fa4_graph_probe.py showed the fixed-table calls give the
# eager calls' bits, docs/fa4-graph-probe-2026-12-02.log). Two calls after
# evals/device/fa4_stash.sh, each within 30 s of the last:
#   --check: the Hopper tests (tests/test_fa4_graph.py: one-graph chunks against the segmented
#     runner's, bit for bit, at 0, 2, 3 and 4 splits with the graphs captured at the warm-up
#     over the reader's pool and over a second pool at its first chunks, and the 256-row
#     question runner at up to 8 splits; tests/test_attn_fa4.py), then the GPU exactness
#     check over the 85k Claude Code session with rewrites (evals/gpu_exact.py) on the
#     default path;
#   (default) pages (this tree, one graph a chunk) against the contiguous tree (.old2), two
#     fresh pairs (evals/pages_ab.py): the read rate over 0-32k and 64-100k read as a backlog,
#     one chunk at 16k and 96k, a question at 32k and 100k, decode. Other arguments go on to
#     pages_ab (e.g. `--pairs 3`, `--profile`).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/graph16.sh [--check]
#     (carry .fa4b .whl .devdata .old2 .devcache)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
case "${1:-}" in
--check)
    # Triton on the GPU (tests/conftest.py would interpret it); the CPU-only tests skip
    TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:warnings \
        -rfs tests/test_fa4_graph.py tests/test_attn_fa4.py 2>&1 | tee "$out/gpu-tests.log" \
        | grep -E "^(FAILED|ERROR|SKIPPED|E )|passed|failed" | cut -c1-300
    timeout 260 python3 -m evals.gpu_exact --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        --cpu-ids 512 2>&1 | grep -v '^!!' | grep -v "UserWarning\|exe_args" \
        | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-1200 ;;
*)
    timeout 560 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" \
        --max-context 112640 --bands 0:32768,65536:102400 --burst 0 --pairs 2 --repeats 3 \
        "$@" 2>&1 | grep -v '^!!' | grep -v "UserWarning\|exe_args" \
        | tee "$out/pages-ab-graph.log" | grep -E "^(pair|across|exact|profile)" | cut -c1-300
    echo "took ${SECONDS} s" ;;
esac
# FA4's compiled kernels for a later cold machine (fa4_env.sh restores .devcache/fa4cache.tgz)
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
