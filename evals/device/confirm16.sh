#!/usr/bin/env bash
# Issue 16, the confirmation, three calls after one stash (each within 30 s of the last):
#   (default) pages (this tree) against the contiguous tree (.old2) over three fresh pairs of
#     workers (evals/pages_ab.py --pairs 3): the read rate over 0-32k and 64-100k read as a
#     backlog (--bands), one chunk at 16k and 96k alone and in bursts of three, decode;
#   --exact: the GPU exactness check over the 85k Claude Code session with rewrites
#     (evals/gpu_exact.py) on the default path, FA4 with the overlapped splits;
#   --tests: the Hopper tests of FA4 over pages (tests/test_attn_fa4.py: the overlapped
#     splits against one stream bit for bit; the other test files run the tiny model on the
#     CPU, as in CI).
#   Other arguments go on to pages_ab after the defaults (the last of an option wins), e.g.
#   `--burst 0 --profile`: no bursts, a kernel-by-kernel profile of each pair's chunks instead.
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/confirm16.sh [--exact | --tests]
#     (carry .fa4b .whl .devdata .old2, and .devcache when it holds fa4cache.tgz)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
case "${1:-}" in
--tests)
    timeout 560 python3 -m pytest -q -p no:cacheprovider -rf tests/test_attn_fa4.py 2>&1 \
        | tee "$out/gpu-tests.log" | tail -n 8 ;;
--exact)
    timeout 560 python3 -m evals.gpu_exact --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        --cpu-ids 512 2>&1 | grep -v '^!!' | grep -v "UserWarning\|exe_args" \
        | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-1200 ;;
*)
    timeout 560 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" \
        --max-context 112640 --bands 0:32768,65536:102400 --ask-at "" --burst 3 --pairs 3 \
        --repeats 3 "$@" 2>&1 | grep -v '^!!' | grep -v "UserWarning\|exe_args" \
        | tee "$out/pages-ab-confirm.log" | grep -E "^(pair|across|exact|profile)" | cut -c1-300 ;;
esac
# FA4's compiled kernels for a later cold machine: copy fa4cache.tgz from the call's files to
# .devcache/ and carry .devcache too (fa4_env.sh restores it; first compiles take 100-123 s)
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
