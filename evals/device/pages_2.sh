#!/usr/bin/env bash
# Issue 16, second call, within 30 s of pages_1.sh: flash-attn-4 installed (fa4_env.sh); the
# FA4 GPU test over pages; then the read benchmark on the same ids with pages (this tree) and
# with today's contiguous buffers (.old2: `git archive e98a38a adapters block_store
# shadow_plugin evals`), one after the other in this call: read bands, the chunk at 16k and
# 96k, the question at 32k and 100k, decode at 100k, exactness after the timed runs.
#   bash evals/device/pages_2.sh      (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/env.sh"          # strict shell, $out, ${ids[@]}, caches
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD
source "$(dirname "$0")/fa4_env.sh" || exit 1
[ -n "${SKIP_TESTS:-}" ] || timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_attn_fa4.py 2>&1 \
    | tee "$out/fa4-tests.log" | tail -n 2
for tree in new old; do
    dir=$PWD; [ $tree = old ] && dir=$PWD/.old2
    (cd "$dir" && PYTHONPATH=$dir:$PYTHONPATH timeout 200 python3 -m evals.read --ids \
        "${ids[@]/#/$OLDPWD/}" --max-context 102400 --grids 512 --ask-at 32768,100352 \
        --parts read,exact,decode,ask --out "$out/read-$tree.json") > "$out/read-$tree.log" 2>&1
    echo "== $tree"; tail -n 1 "$out/read-$tree.log" | cut -c1-1500
done
