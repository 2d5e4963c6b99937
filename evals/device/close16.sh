#!/usr/bin/env bash
# Issue 16's last checks on the final code, two calls after evals/device/fa4_stash.sh, each
# within 30 s of the last:
#   --disk: the Hopper tests of the one-graph chunk and of the identity (tests/test_fa4_graph.py,
#     tests/test_identity.py: the device kind names the SM count); the GPU exactness check over
#     the 85k session (evals/gpu_exact.py: the reader's construction now warms the chunk runner
#     up, its identity carries the kernel picks); then evals/store_bench.py: spill and restore
#     at 10k / 50k / 100k and a second process on the same folder, which finds the first's
#     pages by key and stays exact, on the default FA4 path;
#   (default) the 9-class question at C at 32k and 100k, pages (this tree) against the
#     contiguous tree (.old2), two fresh pairs (evals/pages_ab.py with no chunk points and no
#     bands: each tree reads to the question's line, so the question starts at C), then decode.
#   --buckets-tests: the Hopper tests of the question runners at 64, 128 and 256 rows (up to
#     33, 16 and 8 FA4 splits: one graph against the segmented runner, bit for bit); first, so
#     the FA4 compiles for 64 and 128 rows are in /tmp/fa4cache for the next two;
#   --buckets-same: the small question buckets (Runners small_bucket_rows 64,128: the 69-id
#     question pads to 128 rows, not 256; the default since 2026-12-02, so A is given none)
#     against this tree without them, side by side, two fresh pairs; each worker's load,
#     construction, warm-up and warm-read seconds and CUDA bytes in the `setup` lines;
#   --buckets-old: the same buckets against the contiguous tree (.old2), two fresh pairs (the
#     3 % target's comparison; run it twice for four).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/close16.sh [--disk|--buckets-tests|--buckets-same|--buckets-old]
#     (carry .fa4b .whl .devdata .old2 .devcache)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
case "${1:-}" in
--disk)
    gpu_pytest 200 gpu-tests.log tests/test_fa4_graph.py tests/test_identity.py
    timeout 150 python3 -m evals.gpu_exact --ids "${ids[0]}" --cpu-ids 512 2>&1 | quiet \
        | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-1200
    timeout 220 python3 -m evals.store_bench --ids "${ids[0]}" --more "${ids[1]}" \
        --disk /tmp/shadow-disk 2>&1 | quiet | tee "$out/store-bench.log" | tail -n 2 \
        | cut -c1-2000 ;;
--buckets-tests)
    gpu_pytest 500 gpu-tests-q.log tests/test_fa4_graph.py -k question_runner ;;
--buckets-same|--buckets-old)
    a=(--a . --a-bucket-rows none); [ "$1" = --buckets-old ] && a=(--a .old2)
    timeout 500 python3 -m evals.pages_ab "${a[@]}" --b . --b-bucket-rows 64,128 \
        --ids "${ids[@]}" --max-context 102400 --points "" --ask-at 32768,100352 --pairs 2 \
        --repeats 6 2>&1 | quiet | tee "$out/pages-ab-buckets${1#--buckets}.log" \
        | grep -E "^(pair|across|exact|ask|setup|decode|Traceback|RuntimeError)" | cut -c1-400
    echo "pages_ab exit ${PIPESTATUS[0]}" ;;
*)
    timeout 500 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" \
        --max-context 102400 --points "" --ask-at 32768,100352 --pairs 2 --repeats 6 "$@" \
        2>&1 | quiet | tee "$out/pages-ab-ask.log" | grep -E "^(pair|across|exact|ask)" \
        | cut -c1-300 ;;
esac
echo "took ${SECONDS} s"
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
