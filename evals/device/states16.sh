#!/usr/bin/env bash
# Question runners that hold no output states per graph (ChunkGraphs' return_states=False),
# one call after evals/device/fa4_stash.sh (within 30 s):
#   the Hopper test of a 64-row question runner against one returning states (the same hidden
#   rows at every split count; less memory held by its graphs); then evals/pages_ab.py with
#   the small buckets (64,128) in both trees, the tree before the change (.pre) against this
#   one, one fresh pair: each tree's CUDA bytes in its `setup` line, the question at C at 32k
#   and 100k, decode, and exactness.
#   .pre (here, once): mkdir .pre && git archive 206a578 adapters block_store shadow_plugin \
#     evals | tar xf - -C .pre
# Ran 2026-12-02 before the shared warm-up stream (BENCHMARKS.md, twelfth session); again, it
# measures the one shared warm-up stream (model.capture.side_stream) in B's `setup` bytes.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/states16.sh (carry .fa4b .whl .devdata .pre .devcache)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
gpu_pytest 170 gpu-tests-states.log tests/test_fa4_graph.py -k holds_no_states
timeout 230 python3 -m evals.pages_ab --a .pre --b . --a-bucket-rows 64,128 \
    --b-bucket-rows 64,128 --ids "${ids[@]}" --max-context 102400 --points "" \
    --ask-at 32768,100352 --pairs 1 --repeats 6 2>&1 | quiet \
    | tee "$out/pages-ab-states.log" \
    | grep -E "^(pair|across|exact|ask|setup|decode|Traceback|RuntimeError)" | cut -c1-400
echo "pages_ab exit ${PIPESTATUS[0]}"
echo "took ${SECONDS} s"
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
