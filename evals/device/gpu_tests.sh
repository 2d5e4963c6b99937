#!/usr/bin/env bash
# The GPU test layer and the GPU exactness check on the H200, one device call (about 5
# minutes with warm FA4 caches; the first FA4 compiles take 100-123 s more), after
# evals/device/fa4_stash.sh in the call before (within the tool's 30 s warm window) and
# evals/device/prepare.sh here once:
#   bash evals/device/gpu_tests.sh            tests/gpu (FA4 on Hopper, the CUDA identity, a
#       question longer than a grid in pieces against a fresh reader's, bit for bit)
#       and tests/kernels natively on the GPU (Triton, not its interpreter), then
#       `python -m evals.gpu_exact` over the 85k session: every committed state equals a
#       fresh prefill on the GPU (docs/gpu-check.md)
#   bash evals/device/gpu_tests.sh -k NAME    only the GPU tests NAME selects, no gpu_exact
#   (TESTS_S: the tests' time limit in seconds, 450 by default)
# (carry .fa4b .whl .devdata .devcache). Logs to $OUT or ./out.
source "$(dirname "$0")/fa4_site.sh" || exit 1     # env.sh, the wheels, flash-attn-4
gpu_pytest "${TESTS_S:-450}" gpu-tests.log tests/gpu tests/kernels "$@"
if [ $# -eq 0 ]; then
    timeout 150 python3 -m evals.gpu_exact --ids "${ids[0]}" --cpu-ids 512 2>&1 | quiet \
        | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-1200
fi
echo "took ${SECONDS} s"
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
