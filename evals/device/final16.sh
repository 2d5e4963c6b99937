#!/usr/bin/env bash
# Issue 16 after the host's lead was cut (FA4's page tables staged with the chunk's other
# inputs in one copy; the GDN table's byte counts kept instead of summed) and the decode
# combine vectorised: the CUDA tests of the attentions, runners and pages; the decode combine
# against the one in split order (evals/decode_probe.py --graph); then the interleaved A/B of
# the contiguous tree (.old2) and this one with kernel and host profiles (evals/pages_ab.py).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/final16.sh (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
timeout 170 python3 -m pytest -q -x -p no:cacheprovider tests/test_attn_fa4.py \
    tests/test_attn_triton.py tests/test_decode.py tests/test_adapters.py tests/test_pages.py \
    tests/test_gdn_table.py 2>&1 | tee "$out/gpu-tests.log" | tail -n 3
timeout 100 python3 -m evals.decode_probe --graph --only decode,decode_in_order --rounds 5 \
    --contexts 51200,102400 2>&1 | grep -v '^!!' | tee "$out/decode-probe.log" | tail -n 1 \
    | cut -c1-400
timeout 320 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --profile --max-context 112640 2>&1 \
    | grep -v '^!!' | tee "$out/pages-ab.log" | grep -E "^(chunk|ask|decode|exact|host)|busy" \
    | cut -c1-200
